#!/usr/bin/env bash
# Writes build/hfcheck for tests/gpu/hf_check.py (run on a machine with
# transformers; carry build/hfcheck): a dense, a Mixtral-shaped and a
# SentencePiece model trained a few steps here, exported with tally-export,
# and Tally's own logits for a few sequences (tally-forward).
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${BUILD_DIR:-build}
OUTDIR=build/hfcheck
rm -rf "$OUTDIR" && mkdir -p "$OUTDIR/work"
W=$OUTDIR/work
FORTUNES=$B/demo/fortunes/train
spec() {  # spec FILE TRAIN_PATH MODEL_JSON
  cat >"$1" <<JSON
{"model": $3, "data": {"train_path": "$2", "seq_len": 128},
 "training": {"max_steps": 10, "micro_batch_rows": 4, "seed": 1},
 "optimizer": {"lr": 3e-3, "warmup_steps": 2}}
JSON
}
spec "$W/dense.json" "$FORTUNES" '{"num_layers": 2, "d_model": 64, "num_heads": 4}'
spec "$W/moe.json" "$FORTUNES" \
  '{"num_layers": 2, "d_model": 64, "num_heads": 4, "moe": {"num_experts": 4, "top_k": 2}}'
"$B/cli/tally-prep" train-tokenizer --vocab_size=500 --out="$W/tok.model" \
  /usr/share/games/fortunes/fortunes.u8 >/dev/null
"$B/cli/tally-prep" --out="$W/spm" --tokenizer=sentencepiece:"$W/tok.model" \
  /usr/share/games/fortunes/fortunes.u8 >/dev/null
spec "$W/spm.json" "$W/spm/train" '{"num_layers": 1, "d_model": 32, "num_heads": 2}'
for m in dense moe spm; do
  "$B/worker/tally-train" --spec="$W/$m.json" --checkpoint_dir="$W/$m" --log_every=100 >/dev/null
  "$B/worker/tally-export" --checkpoint="$W/$m/step-00000010.ckpt" --out="$OUTDIR/$m"
done
SEQS="256,72,101,108,108,111,44,32,119,111,114,108,100;256,84,104,101,32,113,117,105,99,107"
SEQS="$SEQS,32,98,114,111,119,110,32,102,111,120,32,106,117,109,112,115;257,3,200,256,10,255,0"
/usr/bin/python3 - "$OUTDIR" "$SEQS" "$B" <<'PY'
import json, struct, subprocess, sys
out, seqs, build = sys.argv[1], sys.argv[2], sys.argv[3]
result = {"sequences": [[int(t) for t in s.split(",")] for s in seqs.split(";")]}
for m in ("dense", "moe"):
    p = subprocess.run([build + "/worker/tally-forward", "--hf=" + out + "/" + m,
                        "--tokens=" + seqs], capture_output=True, text=True, check=True)
    result[m] = json.loads(p.stdout)["logits"]
with open(out + "/logits.json", "w") as f:
    json.dump(result, f)
PY
rm -rf "$W"
du -sh "$OUTDIR"
