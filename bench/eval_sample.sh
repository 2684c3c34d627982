#!/usr/bin/env bash
# The evaluation sample against the whole validation split. For each corpus
# and training seed, tally-train trains one model twice, identically (the
# data order and weights are a function of the seed; evaluation changes
# neither), once evaluating on the whole validation split (eval_tokens: 0)
# and once on a 25% sample of whole documents (data/eval_sample.h), and the
# final evaluations are compared, token-weighted and document-weighted.
# Corpora: the fortunes package (~15k short quotes), Python's standard
# library (bench/corpus2.sh: ~500 long files) and tinyshakespeare (from
# ../shared/data, cut into speeches at blank lines), when present.
#   bench/eval_sample.sh                   # 3 corpora x 3 seeds (about 10 minutes here)
#   SEEDS="1" STEPS=100 bench/eval_sample.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
OUT=$B/bench/eval_sample
SEEDS=${SEEDS:-"1 2 3"}
STEPS=${STEPS:-200}
mkdir -p "$OUT"

. bench/lib/models.sh
ensure_fortunes
TALLY_PREP="$B/cli/tally-prep" bench/corpus2.sh "$B/bench/corpus2" >/dev/null
corpora="fortunes:$B/demo/fortunes corpus2:$B/bench/corpus2"
shakespeare=$(ensure_shakespeare)
[ -z "$shakespeare" ] || corpora="$corpora shakespeare:$shakespeare"

# Trains CORPUS_DIR with SEED, evaluating EVAL_TOKENS, into OUT_FILE (the
# metrics' JSON lines; the run's output beside it).
train() {
  local dir=$1 seed=$2 eval_tokens=$3 out=$4
  cat >"$out.yaml" <<YAML
model: {num_layers: 2, d_model: 64, num_heads: 4}
data: {train_path: $dir/train, seq_len: 256, packing: packed}
training: {max_steps: $STEPS, micro_batch_rows: 8, eval_interval_steps: $STEPS,
           eval_tokens: $eval_tokens, checkpoint_interval_steps: 0, seed: $seed}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 10, grad_clip: 1.0}
YAML
  "$B/worker/tally-train" --spec="$out.yaml" --threads=1 --log_every=100000 \
    --metrics_out="$out.jsonl" >"$out.log" 2>&1
}

rows=()
for entry in $corpora; do
  corpus=${entry%%:*} dir=${entry#*:}
  split_tokens=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["num_tokens"])' "$dir/val.json")
  for seed in $SEEDS; do
    base=$OUT/$corpus-seed$seed
    train "$dir" "$seed" 0 "$base-whole" &
    train "$dir" "$seed" $((split_tokens / 4)) "$base-quarter" &
    wait
    rows+=("$corpus $seed $base")
  done
done

/usr/bin/python3 - "${rows[@]}" <<'PY'
import json, re, statistics, sys
def final(path):
    with open(path + ".jsonl") as f:
        evals = [json.loads(l) for l in f if '"eval_step"' in l]
    with open(path + ".log") as f:
        cover = re.search(r"evaluation sample: (.*)", f.read())
    return evals[-1], cover.group(1) if cover else "?"
print("%-12s %4s  %-9s %-9s %-8s  %-9s %-9s  %s" % (
    "corpus", "seed", "whole", "25%", "diff", "whole/doc", "25%/doc", "sample"))
diffs = {}
for row in sys.argv[1:]:
    corpus, seed, base = row.split()
    w, _ = final(base + "-whole")
    q, cover = final(base + "-quarter")
    d = (q["val_loss"] - w["val_loss"]) / w["val_loss"]
    diffs.setdefault(corpus, []).append(d)
    print("%-12s %4s  %-9.4f %-9.4f %+7.2f%%  %-9.4f %-9.4f  %s" % (
        corpus, seed, w["val_loss"], q["val_loss"], 100 * d, w["doc_val_loss"],
        q["doc_val_loss"], cover))
for corpus, ds in diffs.items():
    print("%s: the 25%% sample's loss is within %.2f%% of the whole split's (mean |diff| %.2f%%, "
          "%d seeds)" % (corpus, 100 * max(abs(d) for d in ds),
                         100 * statistics.mean(abs(d) for d in ds), len(ds)))
PY
