#!/usr/bin/env bash
# Whether a recipe's price depends on when it ran, with and without the
# timing calibration (ExperimentTiming), on one tallyd and one-thread CPU
# workers.
#  1. Two identical variants (`a`, `b`: the same spec and seed, so the same
#     steps to the target) on one worker, two busy loops running while `a`
#     trains and stopped once it has ended: each variant's own median step
#     time, the calibrated one, and b's recipe ratio to a (1 is right), with
#     the calibration and with timing: {calibrate: false}.
#  2. The demo's recipe experiment (examples/experiments/recipe-ab.yaml) on
#     two workers, twice: quiet, and with two busy loops for its first
#     LOADED_SECONDS: every variant's recipe ratio to naive in each run.
#   bench/timing_calibration.sh       # about 10 minutes here
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
OUT=$B/bench/timing_calibration
LOADED_SECONDS=${LOADED_SECONDS:-60}
mkdir -p "$OUT"

. bench/lib/models.sh
ensure_fortunes
. bench/lib/cluster.sh
TALLYCTL="$B/cli/tallyctl"

busy_pids=()
busy_start() { for _ in 1 2; do (while :; do :; done) & busy_pids+=($!); done; }
busy_stop() {
  for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  busy_pids=()
}
trap 'busy_stop; stop_cluster' EXIT

# The state of variant NAME's first run in experiment EXP: variant_state EXP NAME.
variant_state() {
  "$TALLYCTL" experiment get "$1" --output=json | /usr/bin/python3 -c '
import json, sys
e = json.load(sys.stdin)
print(next(v["state"] for v in e["variants"] if v["name"] == sys.argv[1]))' "$2"
}

ab_file() {  # CALIBRATE(true|false) OUT
  cat >"$2" <<YAML
display_name: identical
base:
  model: {num_layers: 2, d_model: 64, num_heads: 4}
  data: {train_path: $B/demo/fortunes/train, seq_len: 256, packing: packed}
  training: {max_steps: 300, micro_batch_rows: 8, eval_interval_steps: 50, eval_tokens: 32768,
             checkpoint_interval_steps: 0, seed: 1}
  optimizer: {lr: 3e-3, min_lr: 3e-4, warmup_steps: 10, grad_clip: 1.0}
  resources: {gpu_type: cpu, gpu_count: 1}
variants:
  - {name: a, overrides: {}}
  - {name: b, overrides: {}}
target: {from_variant: a}
timing: {calibrate: $1}
YAML
}

# Once experiment EXP has ended: its events, JSON and table as OUT.*, the
# cluster stopped, and OUT.json added to the results as "KIND LABEL".
results=()
finish() {  # EXP OUT KIND LABEL
  "$TALLYCTL" experiment watch "$1" >"$2.events" || true
  "$TALLYCTL" experiment get "$1" --output=json >"$2.json"
  "$TALLYCTL" experiment get "$1" >"$2.txt"
  stop_cluster
  cluster_pids=()
  results+=("$3 $4 $2.json")
}

for calibrate in true false; do
  start_cluster "$OUT/ab-$calibrate" 1
  ab_file "$calibrate" "$OUT/ab-$calibrate.yaml"
  exp=$("$TALLYCTL" experiment create -f "$OUT/ab-$calibrate.yaml")
  busy_start
  until [[ "$(variant_state "$exp" a)" =~ SUCCEEDED|FAILED|STOPPED|CANCELLED ]]; do sleep 1; done
  busy_stop
  finish "$exp" "$OUT/ab-$calibrate" ab "$calibrate"
done

sed "s|build/demo/fortunes/train|$B/demo/fortunes/train|" examples/experiments/recipe-ab.yaml \
  >"$OUT/recipe-ab.yaml"
for load in quiet loaded; do
  start_cluster "$OUT/demo-$load" 2
  exp=$("$TALLYCTL" experiment create -f "$OUT/recipe-ab.yaml")
  if [ "$load" = loaded ]; then
    busy_start
    (sleep "$LOADED_SECONDS"; busy_stop) &
    stopper=$!
  fi
  "$TALLYCTL" experiment watch "$exp" >/dev/null || true
  [ "$load" = loaded ] && { wait "$stopper" || true; busy_stop; }
  finish "$exp" "$OUT/demo-$load" demo "$load"
done

/usr/bin/python3 - "${results[@]}" <<'PY'
import json, sys

runs = []
for arg in sys.argv[1:]:  # "KIND LABEL FILE"
    kind, label, path = arg.split(" ", 2)
    runs.append((kind, label, json.load(open(path))))
print("1. Two identical variants on one worker, two busy loops while `a` trained:")
print("%-11s %-8s %-10s %-12s %-12s %-8s" % ("calibrate", "variant", "own s/step",
                                              "calibrated", "recipe $", "ratio"))
for kind, label, e in runs:
    if kind != "ab":
        continue
    for v in e["variants"]:
        print("%-11s %-8s %-10.4f %-12s %-12.6f %-8.3f" % (
            label, v["name"], v["own_step_seconds"],
            "%.4f" % v["step_seconds"] if v["timing_calibrated"] else "-",
            v["recipe_cost_to_target_usd"], v["recipe_ratio_to_reference"]))
print()
print("2. The demo experiment, quiet and with two busy loops for its start:")
demo = {label: e for kind, label, e in runs if kind == "demo"}
names = [v["name"] for v in demo["quiet"]["variants"]]
def own_ratio(e, v):
    # The ratio had each run been priced at its own median step time.
    r = e["variants"][0]
    if not (v["steps_to_target"] and r["steps_to_target"] and r["own_step_seconds"]):
        return 0
    return (v["steps_to_target"] * v["own_step_seconds"]
            / (r["steps_to_target"] * r["own_step_seconds"]))
print("%-22s %-12s %-13s %-8s %-22s" % ("variant", "ratio quiet", "ratio loaded", "differ",
                                       "loaded, own step times"))
for n in names:
    q = next(v for v in demo["quiet"]["variants"] if v["name"] == n)
    l = next(v for v in demo["loaded"]["variants"] if v["name"] == n)
    rq, rl = q["recipe_ratio_to_reference"], l["recipe_ratio_to_reference"]
    print("%-22s %-12.3f %-13.3f %-8s %-22.3f" % (
        n, rq, rl, "%+.1f%%" % (100 * (rl / rq - 1)) if rq and rl else "-",
        own_ratio(demo["loaded"], l)))
for label in ("quiet", "loaded"):
    c = demo[label]["calibration"]
    print("%s: calibration %s %s, $%.6f; own step times %s" % (
        label, c["job"], c["state"], c["cost_usd"],
        ", ".join("%s %.4f" % (v["name"], v["own_step_seconds"])
                  for v in demo[label]["variants"])))
PY
