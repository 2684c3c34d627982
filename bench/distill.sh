#!/usr/bin/env bash
# Distillation into a smaller model: a 1-layer student (bench/upcycle/
# student.yaml) trained for the same 300 steps on fortunes without and with
# a trained 2-layer teacher (bench/upcycle/dense.yaml's 600-step checkpoint,
# trained here unless it exists), alpha 0.5 and temperature 2, and the plain
# student again for 500 steps (about the distilled run's dollars). One after
# the other, one thread each. Prints each run's validation losses, its wall
# seconds and its dollars at examples/tallyd.yaml's cpu price ($0.05/hour).
#   bench/distill.sh        # about 1 minute here (plus 2 for the teacher)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
OUT=$B/bench/distill
mkdir -p "$OUT"
. bench/lib/models.sh
ensure_dense
TEACHER=$DENSE
cp bench/upcycle/student.yaml "$OUT/plain.yaml"
# The same spec with training.distill added after training.seed.
sed "s|^  seed: 3\$|  seed: 3\n  distill: {teacher: {checkpoint: $TEACHER}, temperature: 2, alpha: 0.5}|" \
  bench/upcycle/student.yaml >"$OUT/distilled.yaml"
sed 's/^  max_steps: 300$/  max_steps: 500/' bench/upcycle/student.yaml >"$OUT/plain-500.yaml"
for run in plain distilled plain-500; do
  start=$(date +%s%N)
  "$B/worker/tally-train" --spec="$OUT/$run.yaml" --threads=1 --log_every=1000 >"$OUT/$run.log"
  echo $((($(date +%s%N) - start) / 1000000)) >"$OUT/$run.ms"
done
echo "run        val_loss at steps 0, 50, 100, ...; wall seconds; dollars at \$0.05/hour"
for run in plain distilled plain-500; do
  losses=$(grep -oE "val_loss [0-9.]+" "$OUT/$run.log" | awk '{printf "%s ", $2}')
  ms=$(cat "$OUT/$run.ms")
  awk -v r="$run" -v l="$losses" -v ms="$ms" \
    'BEGIN { printf "%-10s %s; %.1f s; $%.6f\n", r, l, ms / 1000, ms / 1000 * 0.05 / 3600 }'
done
grep -h "distilling from" "$OUT/distilled.log" | sed 's/.*; distilling/distilling/'
