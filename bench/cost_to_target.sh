#!/usr/bin/env bash
# The cost-to-target benchmark: the demo's recipe experiment (naive = padded to
# seq_len, dense, to max_steps; packed; packed MoE; packed MoE with the
# forecast stop; target: naive's final validation loss) on a larger budget,
# on two very different corpora: the fortunes package (~15k short quotes) and
# Python's standard library source (~500 long files, bench/corpus2.sh). One
# tallyd and two one-thread CPU workers run both experiments; each prints its
# table, the combined saving (naive's dollars to its own final loss over the
# cheapest variant's dollars to the same loss) and an SVG of validation loss
# against dollars under $OUT.
#   bench/cost_to_target.sh            # both corpora (about 15 minutes here)
#   CORPORA=fortunes bench/cost_to_target.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
OUT=$B/bench/cost_to_target
CORPORA=${CORPORA:-"fortunes corpus2"}
mkdir -p "$OUT"

. bench/lib/models.sh
ensure_fortunes
case " $CORPORA " in *" corpus2 "*) TALLY_PREP="$B/cli/tally-prep" bench/corpus2.sh "$B/bench/corpus2" ;; esac

. bench/lib/cluster.sh
start_cluster "$OUT" 2

TALLYCTL="$B/cli/tallyctl"
for corpus in $CORPORA; do
  file=bench/cost_to_target/$corpus.yaml
  echo "== Cost to target: $file =="
  start=$SECONDS
  exp=$("$TALLYCTL" experiment create -f "$file")
  "$TALLYCTL" experiment watch "$exp" >"$OUT/$corpus.events" || true
  "$TALLYCTL" experiment report "$exp" --svg="$OUT/$corpus.svg"
  /usr/bin/python3 - "$TALLYCTL" "$exp" "$corpus" "$((SECONDS - start))" <<'PY'
import json, subprocess, sys
ctl, name, corpus, seconds = sys.argv[1:]
e = json.loads(subprocess.run([ctl, "experiment", "get", name, "--output=json"], check=True,
                              capture_output=True, text=True).stdout)
ref = next(v for v in e["variants"] if v["name"] == e["reference_variant"])
others = [v for v in e["variants"] if v["reached_target"] and v["name"] != ref["name"]]
print("%s: %s wall seconds for the experiment, target val loss %.4f" % (
    corpus, seconds, e["target_val_loss"]))
print("%-22s %-16s %6s %8s %9s %12s %12s %8s" % (
    "variant", "state", "steps", "final", "to_step", "tokens_to", "usd_to", "x_ref"))
for v in e["variants"]:
    print("%-22s %-16s %6s %8.4f %9s %12.0f %12.6f %8s" % (
        v["name"], v["state"].replace("JOB_STATE_", "").lower(), v["step"],
        v["final_val_loss"], v["target_step"] if v["reached_target"] else "-",
        v["tokens_to_target"], v["cost_to_target_usd"],
        "%.2f" % v["ratio_to_reference"] if v["ratio_to_reference"] else "-"))
if ref["reached_target"] and others:
    best = min(others, key=lambda v: v["cost_to_target_usd"])
    print("combined saving: %s $%.6f to its own final loss, %s $%.6f to the same loss: "
          "%.2fx" % (ref["name"], ref["cost_to_target_usd"], best["name"],
                     best["cost_to_target_usd"],
                     ref["cost_to_target_usd"] / best["cost_to_target_usd"]))
else:
    print("combined saving: none measurable (no variant besides %s reached the target)"
          % ref["name"])
PY
  echo
done
