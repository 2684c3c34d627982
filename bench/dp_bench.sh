#!/usr/bin/env bash
# Data parallel on this machine: the same spec and global batch trained by
# one tally-train process and by two ranks joined by c10d's Gloo group on
# loopback, side by side, one CPU thread per process. Prints step time,
# useful tokens/s and the loss each reaches (they must agree). Asserts
# nothing; the README records its table. Usage: bench/dp_bench.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${1:-${BUILD_DIR:-build}}
STEPS=${STEPS:-40}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
[ -s "$B/demo/fortunes/train.idx" ] ||
  "$B/cli/tally-prep" --out="$B/demo/fortunes" /usr/share/games/fortunes/*.u8 >/dev/null
cat >"$tmp/spec.yaml" <<YAML
model: {num_layers: 2, d_model: 128, num_heads: 4}
data: {train_path: $B/demo/fortunes/train, seq_len: 512}
training: {micro_batch_rows: 4, global_batch_tokens: 8192, max_steps: $STEPS, seed: 1}
optimizer: {lr: 3e-3, warmup_steps: 5, grad_clip: 1.0}
resources: {gpu_type: cpu, gpu_count: 2}
YAML
port=$((30000 + RANDOM % 20000))
"$B/worker/tally-train" --spec="$tmp/spec.yaml" --threads=1 --log_every=1000 \
  --metrics_out="$tmp/one.jsonl" >/dev/null
for r in 0 1; do
  "$B/worker/tally-train" --spec="$tmp/spec.yaml" --threads=1 --log_every=1000 \
    --world_size=2 --rank=$r --rendezvous=127.0.0.1:$port \
    --metrics_out="$tmp/two-$r.jsonl" >/dev/null &
done
wait
/usr/bin/python3 - "$tmp" "$STEPS" <<'PY'
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
def load(name):
    return [json.loads(l) for l in open("%s/%s.jsonl" % (d, name)) if '"step"' in l]
print("%d steps of 8192 tokens (4 micro-batches of 4 x 512), 2 layers, d_model 128; "
      "times exclude the first 5 steps" % steps)
print("| processes | ms/step | useful tokens/s | train loss at the last step |")
print("|---|---|---|---|")
rows = {}
for label, name in (("1 (one thread)", "one"), ("2 ranks, Gloo on loopback (one thread each)", "two-0")):
    s = load(name)
    t = [x["step_seconds"] for x in s[5:]]
    tok = (s[-1]["tokens"] - s[4]["tokens"]) / sum(t)
    rows[name] = sum(t) / len(t)
    print("| %s | %.1f | %.0f | %.6f |" % (label, 1000 * sum(t) / len(t), tok, s[-1]["train_loss"]))
print("\nspeed-up with 2 ranks: %.2fx" % (rows["one"] / rows["two-0"]))
PY
