#!/usr/bin/env bash
# Distillation into a smaller model: a 1-layer student (bench/upcycle/
# student.yaml) trained for the same 300 steps on fortunes without and with
# a trained 2-layer teacher (bench/upcycle/dense.yaml's 600-step checkpoint,
# trained here unless it exists), alpha 0.5 and temperature 2, and the plain
# student again for 500 steps (about the distilled run's dollars). Prints
# each run's validation losses, its recipe dollars at examples/tallyd.yaml's
# cpu price ($0.05/hour) and its wall seconds.
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
# plain and distilled side by side (one thread each), then plain-500. Each
# run is priced like an experiment's recipe cost: its steps x its median
# step time x the price, which load on a minority of its steps does not
# move; wall seconds are shown beside it.
run() {
  start=$(date +%s%N)
  "$B/worker/tally-train" --spec="$OUT/$1.yaml" --threads=1 --log_every=1000 \
    --metrics_out="$OUT/$1.jsonl" >"$OUT/$1.log"
  echo $((($(date +%s%N) - start) / 1000000)) >"$OUT/$1.ms"
}
run plain & run distilled & wait
run plain-500
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
print("run        val_loss at steps 0, 50, 100, ...; steps x median step ms = recipe $ at $0.05/hour; wall s")
for run in ("plain", "distilled", "plain-500"):
    rows = [json.loads(l) for l in open("%s/%s.jsonl" % (out, run))]
    losses = " ".join("%.4f" % r["val_loss"] for r in rows if "eval_step" in r)
    steps = [r["step_seconds"] for r in rows if "step" in r]
    median = statistics.median(steps)
    wall = int(open("%s/%s.ms" % (out, run)).read()) / 1000
    print("%-10s %s; %d x %.1f ms = $%.6f; %.1f s" % (
        run, losses, len(steps), 1000 * median, len(steps) * median * 0.05 / 3600, wall))
PY
grep -h "distilling from" "$OUT/distilled.log" | sed 's/.*; distilling/distilling/'
