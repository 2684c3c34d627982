#!/usr/bin/env bash
# Packing against the padded baseline, by tokens and steps to the same loss,
# over seeds and corpora. For each corpus, seq_len and seed, tally-train
# trains the same model three ways on the same schedule (warmup, cosine to
# lr/10 at STEPS): `padded` (one document chunk per row, padded to seq_len:
# the baseline), `packed` (the same rows a step, packed: more useful tokens a
# step) and `packed-equal` (packed with fewer rows, so that a step holds
# about the useful tokens of a padded step). Every run is judged on its
# corpus's whole validation split (eval_tokens: 0) every EVERY steps. For
# each packed run against the padded run of its seed it prints the steps and
# tokens to the padded run's final loss (interpolated between the two
# evaluations that straddle it) and the final losses, which compare the two at
# the same point of the same schedule; then per corpus the mean and the
# spread (min-max) over the seeds.
# Corpora: the fortunes package, Python's standard library (bench/corpus2.sh,
# its validation split held out by tokens: --val_tokens=65536) and
# tinyshakespeare cut into speeches (../shared/data), when present.
#   bench/packing_efficiency.sh           # about 30 minutes here
#   SEEDS="1 2" STEPS=200 bench/packing_efficiency.sh
#   ONLY_CONFIGS="stdlib:128 shakespeare:128" bench/packing_efficiency.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
OUT=$B/bench/packing_efficiency
SEEDS=${SEEDS:-"1 2 3"}
STEPS=${STEPS:-300}
EVERY=${EVERY:-25}
ROWS=${ROWS:-8}
mkdir -p "$OUT"

. bench/lib/models.sh
ensure_fortunes
PREP="$B/cli/tally-prep"
# Python's standard library, held out by tokens across lengths (the default
# split gives one module 17.8% of the validation tokens).
PREP_ARGS=--val_tokens=65536 TALLY_PREP="$PREP" bench/corpus2.sh "$OUT/stdlib" >/dev/null
CONFIGS="fortunes:$B/demo/fortunes:256 fortunes:$B/demo/fortunes:128 stdlib:$OUT/stdlib:256
  stdlib:$OUT/stdlib:128"
shakespeare=$(ensure_shakespeare)
[ -z "$shakespeare" ] ||
  CONFIGS="$CONFIGS shakespeare:$shakespeare:256 shakespeare:$shakespeare:128"
# ONLY_CONFIGS="stdlib:128 shakespeare:128" runs those corpus:seq_len pairs.
if [ -n "${ONLY_CONFIGS:-}" ]; then
  kept=""
  for config in $CONFIGS; do
    IFS=: read -r corpus _ seq <<<"$config"
    [[ " $ONLY_CONFIGS " == *" $corpus:$seq "* ]] && kept="$kept $config"
  done
  CONFIGS=$kept
fi

# Rows a packed step needs for the useful tokens of a padded step of ROWS
# rows: ROWS x the padded plan's useful fraction (from the documents'
# lengths), at least 1.
equal_rows() {
  /usr/bin/python3 - "$1/train" "$2" "$ROWS" <<'PY'
import math, struct, sys
prefix, seq, rows = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(prefix + ".idx", "rb") as f:
    data = f.read()
n = struct.unpack_from("<Q", data, 16)[0]
offs = struct.unpack_from("<%dQ" % (n + 1), data, 24)
lens = [b - a for a, b in zip(offs, offs[1:])]
slots = sum(math.ceil(l / seq) for l in lens if l) * seq
print(max(1, round(rows * sum(lens) / slots)))
PY
}

train() {  # DIR SEQ SEED MODE ROWS OUT
  cat >"$6.yaml" <<YAML
model: {num_layers: 2, d_model: 64, num_heads: 4}
data: {train_path: $1/train, seq_len: $2, packing: $4}
training: {max_steps: $STEPS, micro_batch_rows: $5, global_batch_tokens: $(($2 * $5)),
           eval_interval_steps: $EVERY, eval_tokens: 0, checkpoint_interval_steps: 0, seed: $3}
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 10, grad_clip: 1.0}
YAML
  "$B/worker/tally-train" --spec="$6.yaml" --threads=1 --log_every=100000 \
    --metrics_out="$6.jsonl" >"$6.log" 2>&1
}

runs=()
for config in $CONFIGS; do
  IFS=: read -r corpus dir seq <<<"$config"
  eq=$(equal_rows "$dir" "$seq")
  for seed in $SEEDS; do
    base=$OUT/$corpus-$seq-seed$seed
    train "$dir" "$seq" "$seed" pad_to_seq_len "$ROWS" "$base-padded" &
    train "$dir" "$seq" "$seed" packed "$ROWS" "$base-packed" &
    wait
    train "$dir" "$seq" "$seed" packed "$eq" "$base-packed-equal"
    runs+=("$corpus $seq $seed $eq $base")
  done
done

/usr/bin/python3 - "$ROWS" "${runs[@]}" <<'PY'
import json, statistics, sys

def curve(path):
    """[(step, tokens, val_loss)] of a run's evaluations."""
    tokens, evals = {0: 0}, []
    with open(path + ".jsonl") as f:
        for line in f:
            r = json.loads(line)
            if "eval_step" in r:
                evals.append((r["eval_step"], r["val_loss"]))
            else:
                tokens[r["step"]] = r["tokens"]
    return [(s, tokens.get(s, 0), l) for s, l in evals]

def crossing(c, target):
    """(steps, tokens) where the curve first reaches `target`, interpolated
    linearly in loss between the straddling evaluations; None if never."""
    for (s0, t0, l0), (s1, t1, l1) in zip(c, c[1:]):
        if l1 <= target:
            f = (l0 - target) / (l0 - l1) if l0 > l1 else 1.0
            return s0 + f * (s1 - s0), t0 + f * (t1 - t0)
    return None

rows = int(sys.argv[1])
print("%-12s %4s %4s  %-8s %-8s %-8s  %-24s %-24s" % (
    "corpus", "seq", "seed", "padded", "packed", "p-equal", "packed: steps, tokens",
    "packed-equal: steps, tokens"))
groups = {}
for run in sys.argv[2:]:
    corpus, seq, seed, eq, base = run.split()
    pad, pk, pe = curve(base + "-padded"), curve(base + "-packed"), curve(base + "-packed-equal")
    target, (ps, pt, _) = pad[-1][2], pad[-1]
    cells, g = [], groups.setdefault((corpus, seq, eq), {"k": [], "e": [], "fk": [], "fe": []})
    for name, c, key in (("packed", pk, "k"), ("packed-equal", pe, "e")):
        x = crossing(c, target)
        g["f" + key].append(c[-1][2] - target)
        if x is None:
            cells.append("never")
            continue
        g[key].append((x[0] / ps, x[1] / pt))
        cells.append("%.2fx, %.2fx" % (x[0] / ps, x[1] / pt))
    print("%-12s %4s %4s  %-8.4f %-8.4f %-8.4f  %-24s %-24s" % (
        corpus, seq, seed, target, pk[-1][2], pe[-1][2], cells[0], cells[1]))
print()
print("Against the padded baseline of the same seed, mean (min-max) over seeds:")
for (corpus, seq, eq), g in groups.items():
    def stat(v):
        return ("%.2fx (%.2f-%.2f)" % (statistics.mean(v), min(v), max(v))) if v else "-"
    def diff(v):
        return "%+.4f (%+.4f to %+.4f)" % (statistics.mean(v), min(v), max(v))
    print("%s seq_len %s: packed %s steps, %s tokens to padded's final loss; final loss %s" % (
        corpus, seq, stat([s for s, _ in g["k"]]), stat([t for _, t in g["k"]]), diff(g["fk"])))
    print("%s seq_len %s: packed-equal (%s rows a step, padded %d) %s steps, %s tokens; "
          "final loss %s" % (corpus, seq, eq, rows, stat([s for s, _ in g["e"]]),
                             stat([t for _, t in g["e"]]), diff(g["fe"])))
PY
