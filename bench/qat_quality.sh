#!/usr/bin/env bash
# What quantization costs a model, and how much of it quantization-aware
# training (QAT) wins back, over seeds and corpora; and what QAT costs a step.
# For each corpus and seed, tally-train trains the same model (same schedule,
# data order and init) three ways: `plain` (no QAT), `qat-q8_0` and `qat-q4_0`
# (training.qat, LAYERS). The plain model's final checkpoint is then scored
# quantized both ways (post-training quantization, PTQ: a one-step run from
# it whose step-0 evaluation is that of the checkpoint, training.
# eval_quantized). Every score is on the same evaluation sample. Per format it
# prints the plain model's high-precision loss (hp), its PTQ loss, the QAT
# model's quantized loss, and the share of PTQ's degradation that QAT
# recovers, (ptq - qat) / (ptq - hp) (not given where PTQ costs under 0.005
# nats: the ratio would be of noise); then per corpus the mean and spread
# (min-max) over seeds. Then what QAT costs a step: ROUNDS rounds of
# COST_STEPS-step runs, plain, qat-q8_0 and qat-q4_0 one after another on one
# thread with nothing else running, the order rotating each round; each
# run's median step time after its first 5 steps, and QAT's over plain's
# within the round, mean (min-max) over the rounds.
#   bench/qat_quality.sh                         # about 20 minutes here
#   SEEDS="1 2 3" STEPS=600 LAYERS=ffn bench/qat_quality.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
OUT=$B/bench/qat_quality
SEEDS=${SEEDS:-"1 2"}
STEPS=${STEPS:-300}
LAYERS=${LAYERS:-all_linear}
MODEL=${MODEL:-"{num_layers: 4, d_model: 128, num_heads: 4}"}
ROUNDS=${ROUNDS:-3}
COST_STEPS=${COST_STEPS:-40}
mkdir -p "$OUT"

. bench/lib/models.sh
ensure_fortunes
CORPORA="fortunes:$B/demo/fortunes"
shakespeare=$(ensure_shakespeare)
[ -z "$shakespeare" ] || CORPORA="$CORPORA shakespeare:$shakespeare"

spec() {  # DATA SEED STEPS TRAINING_EXTRA OUT
  cat >"$5.yaml" <<YAML
model: $MODEL
data: {train_path: $1/train, seq_len: 128, packing: packed}
training: {max_steps: $3, micro_batch_rows: 8, eval_interval_steps: $3, eval_tokens: 32768,
           checkpoint_interval_steps: 0, seed: $2 $4}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: $(($3 > 20 ? 20 : 0)), grad_clip: 1.0,
            weight_decay: 0.1}
YAML
}

train() {  # DATA SEED TRAINING_EXTRA OUT [FLAGS...]
  spec "$1" "$2" "$STEPS" "$3" "$4"
  local out=$4
  shift 4
  "$B/worker/tally-train" --spec="$out.yaml" --threads=1 --log_every=100000 \
    --metrics_out="$out.jsonl" "$@" >"$out.log" 2>&1
}

runs=()
for config in $CORPORA; do
  IFS=: read -r corpus dir <<<"$config"
  for seed in $SEEDS; do
    base=$OUT/$corpus-seed$seed
    rm -rf "$base-plain.ckpts"
    train "$dir" "$seed" "" "$base-plain" --checkpoint_dir="$base-plain.ckpts" &
    train "$dir" "$seed" ", qat: {format: q8_0, layers: $LAYERS}" "$base-qat-q8_0" &
    wait
    train "$dir" "$seed" ", qat: {format: q4_0, layers: $LAYERS}" "$base-qat-q4_0" &
    ckpt=$(ls "$base-plain.ckpts"/step-*.ckpt | tail -1)
    for q in q8_0 q4_0; do
      # One step from the plain model: its step-0 evaluation is the PTQ score.
      spec "$dir" "$seed" 1 ", eval_quantized: $q, eval_quantized_layers: $LAYERS" "$base-ptq-$q"
      sed -i "s|^model: {\(.*\)}\$|model: {\1, init_from: {checkpoint: $ckpt}}|" \
        "$base-ptq-$q.yaml"
      "$B/worker/tally-train" --spec="$base-ptq-$q.yaml" --threads=1 --log_every=100000 \
        --metrics_out="$base-ptq-$q.jsonl" >"$base-ptq-$q.log" 2>&1
    done
    wait
    runs+=("$corpus $seed $base")
  done
done

# The step cost, on the first corpus.
IFS=: read -r _ cost_dir <<<"${CORPORA%% *}"
cost_runs=()
for round in $(seq "$ROUNDS"); do
  kinds=("plain" "qat-q8_0" "qat-q4_0")
  for i in 0 1 2; do
    kind=${kinds[$(((i + round) % 3))]}
    extra=""
    [ "$kind" = plain ] || extra=", qat: {format: ${kind#qat-}, layers: $LAYERS}"
    out=$OUT/cost-round$round-$kind
    spec "$cost_dir" 1 "$COST_STEPS" "$extra" "$out"
    sed -i "s/eval_interval_steps: $COST_STEPS/eval_interval_steps: 0/" "$out.yaml"
    "$B/worker/tally-train" --spec="$out.yaml" --threads=1 --log_every=100000 \
      --metrics_out="$out.jsonl" >"$out.log" 2>&1
  done
  cost_runs+=("$OUT/cost-round$round")
done

/usr/bin/python3 - "$LAYERS" "${runs[@]}" -- "${cost_runs[@]}" <<'PY'
import json, statistics, sys

def evals(path):
    out, steps = [], []
    with open(path + ".jsonl") as f:
        for line in f:
            r = json.loads(line)
            (out if "eval_step" in r else steps).append(r)
    return out, steps

def spread(xs):
    return "%.3f (%.3f-%.3f)" % (statistics.mean(xs), min(xs), max(xs)) if xs else "-"

layers = sys.argv[1]
print("layers: %s; losses on the same evaluation sample (nats per token)" % layers)
print("%-12s %4s %-5s %-8s %-8s %-8s %-9s %-9s %-9s" % (
    "corpus", "seed", "quant", "hp", "ptq", "qat", "ptq-hp", "qat-hp", "recovered"))
groups = {}
split = sys.argv.index("--")
quality, cost = sys.argv[2:split], sys.argv[split + 1:]
for run in quality:
    corpus, seed, base = run.split()
    plain, plain_steps = evals(base + "-plain")
    hp = plain[-1]["val_loss"]
    for q in ("q8_0", "q4_0"):
        ptq_evals, _ = evals(base + "-ptq-" + q)
        ptq = ptq_evals[0]["quantized_val_loss"]
        qat_evals, qat_steps = evals(base + "-qat-" + q)
        qat = qat_evals[-1]["quantized_val_loss"]
        g = groups.setdefault((corpus, q), {"deg": [], "rec": [], "qat_hp": []})
        # Below this the ratio is of noise: the two trainings' losses differ
        # by more than the degradation they are measured against.
        rec = (ptq - qat) / (ptq - hp) if ptq - hp >= 0.005 else float("nan")
        g["deg"].append(ptq - hp)
        g["qat_hp"].append(qat - hp)
        if rec == rec:
            g["rec"].append(rec)
        print("%-12s %4s %-5s %-8.4f %-8.4f %-8.4f %-+9.4f %-+9.4f %s" % (
            corpus, seed, q, hp, ptq, qat, ptq - hp, qat - hp,
            "%.0f%%" % (100 * rec) if rec == rec else "n/a (ptq-hp < 0.005)"))
print()
print("Mean (min-max) over seeds:")
print("%-12s %-5s %-26s %-26s %-26s" % (
    "corpus", "quant", "PTQ degradation", "QAT - hp", "recovered"))
for (corpus, q), g in groups.items():
    print("%-12s %-5s %-26s %-26s %-26s" % (
        corpus, q, spread(g["deg"]), spread(g["qat_hp"]), spread(g["rec"])))
print()
def median_step(path):
    _, steps = evals(path)
    return statistics.median(x["step_seconds"] for x in steps[5:])
print("QAT's step time over plain training's (%s; %d rounds, mean (min-max)):" % (
    layers, len(cost)))
for q in ("q8_0", "q4_0"):
    ratios = [median_step(r + "-qat-" + q) / median_step(r + "-plain") for r in cost]
    plain = [median_step(r + "-plain") for r in cost]
    print("  %s: %s   (plain step %.1f ms)" % (q, spread(ratios), 1000 * statistics.mean(plain)))
PY
