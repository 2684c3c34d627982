#!/usr/bin/env bash
# `make demo`: prepares a real corpus (the fortunes package: ~15k short
# documents of very different lengths), starts tallyd and two CPU workers
# here, trains a packed job next to its padded baseline through tallyd, shows
# both as they go, and a side-by-side summary; then a two-rank job, and last
# an experiment that compares four recipes by their dollars to one target
# loss, with its table and an SVG of loss against dollars.
# Secure, as in production: a throwaway PKI (scripts/dev-pki.sh) gives tallyd
# a TLS certificate, each worker a client certificate whose CN is its
# --worker_id, and tokens for an admin and a user of tenant "demo"; every
# tallyctl call sends the user's token over TLS. Only /metrics stays plain
# HTTP, on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
DEMO=$B/demo
mkdir -p "$DEMO"
rm -rf "$DEMO/tallyd" "$DEMO/checkpoints" && mkdir -p "$DEMO/tallyd"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

if [ ! -s "$DEMO/fortunes/train.idx" ]; then
  echo "\$ tally-prep --out=$DEMO/fortunes /usr/share/games/fortunes/*.u8"
  "$B/cli/tally-prep" --out="$DEMO/fortunes" /usr/share/games/fortunes/*.u8
else
  echo "corpus: $DEMO/fortunes (prepared earlier by tally-prep)"
fi

PKI=$DEMO/pki
echo "\$ scripts/dev-pki.sh $PKI demo-cpu-0 demo-cpu-1"
scripts/dev-pki.sh "$PKI" demo-cpu-0 demo-cpu-1

"$B/server/tallyd" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --data_dir="$DEMO/tallyd" --address_file="$DEMO/tallyd/addr" \
  --config=examples/tallyd.yaml \
  --tls_cert="$PKI/tallyd.crt" --tls_key="$PKI/tallyd.key" --client_ca="$PKI/ca.crt" \
  --auth_tokens="$PKI/users.yaml" >"$DEMO/tallyd.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$DEMO/tallyd/addr" ] && break; sleep 0.05; done
[ -s "$DEMO/tallyd/addr" ] || { echo "tallyd did not start:"; cat "$DEMO/tallyd.log"; exit 1; }
GRPC=$(sed 's/grpc=\([^ ]*\).*/\1/' "$DEMO/tallyd/addr")
METRICS=$(sed 's/.*metrics=//' "$DEMO/tallyd/addr")
export TALLY_CONTROLLER=$GRPC TALLY_CA_CERT=$PKI/ca.crt
TALLY_TOKEN=$(cat "$PKI/user.token")
export TALLY_TOKEN
echo "tallyd: gRPC over TLS $GRPC (clients: a token; workers: a client certificate),"
echo "        metrics http://$METRICS/metrics (plain HTTP, loopback only; log: $DEMO/tallyd.log)"
echo "        prices from examples/tallyd.yaml: a cpu slot costs \$0.05 an hour"

# Two workers, one core each, so the two jobs run side by side.
for i in 0 1; do
  "$B/worker/tally-worker" --worker_id=demo-cpu-$i --threads=1 \
    --ca_cert="$PKI/ca.crt" --tls_cert="$PKI/workers/demo-cpu-$i.crt" \
    --tls_key="$PKI/workers/demo-cpu-$i.key" --data_root="$DEMO/fortunes" \
    --checkpoint_dir="$DEMO/checkpoints" --rendezvous_host=127.0.0.1 \
    --rendezvous_port=$((29610 + 10 * i)) >"$DEMO/worker-$i.log" 2>&1 &
  pids+=($!)
done
echo "tally-worker: demo-cpu-0, demo-cpu-1, each with its client certificate, reading data"
echo "              only under $DEMO/fortunes (logs: $DEMO/worker-*.log)"
echo
echo "How to call it (from this directory, while the demo runs):"
echo "  export TALLY_CONTROLLER=$GRPC TALLY_CA_CERT=$PKI/ca.crt TALLY_TOKEN=\$(cat $PKI/user.token)"
echo "  $B/cli/tallyctl list        # admin, every tenant: TALLY_TOKEN=\$(cat $PKI/admin.token)"
echo

TALLYCTL="$B/cli/tallyctl"
echo "\$ TALLY_TOKEN= tallyctl list      # no token: refused"
if refused=$(TALLY_TOKEN= "$TALLYCTL" list 2>&1); then
  echo "tallyd accepted a call without a token"; exit 1
fi
echo "$refused" | head -1
echo
echo "\$ tallyctl estimate -f examples/jobs/tiny.yaml"
"$TALLYCTL" estimate -f examples/jobs/tiny.yaml
echo
echo "\$ tallyctl submit -f examples/jobs/tiny.yaml          # packed"
PACKED=$("$TALLYCTL" submit -f examples/jobs/tiny.yaml)
echo "$PACKED"
echo "\$ tallyctl submit -f examples/jobs/tiny-padded.yaml   # padded baseline"
PADDED=$("$TALLYCTL" submit -f examples/jobs/tiny-padded.yaml)
echo "$PADDED"
echo
echo "\$ tallyctl watch $PACKED & tallyctl watch $PADDED"
"$TALLYCTL" watch "$PACKED" | sed -u 's/^/[packed] /' &
w1=$!
"$TALLYCTL" watch "$PADDED" | sed -u 's/^/[padded] /' &
w2=$!
wait $w1 $w2 || true
echo
echo "\$ tallyctl cost $PACKED"
"$TALLYCTL" cost "$PACKED"
echo

/usr/bin/python3 - "$TALLYCTL" "$PACKED" "$PADDED" <<'PY'
import json, subprocess, sys
from datetime import datetime
ctl, names = sys.argv[1], sys.argv[2:]

def ctl_json(*args):
    return json.loads(subprocess.run([ctl, *args, "--output=json"], check=True,
                                     capture_output=True, text=True).stdout)

def seconds(a, b):
    f = lambda t: datetime.fromisoformat(t.replace("Z", "+00:00"))
    return (f(b) - f(a)).total_seconds()

print("Summary: same model, seed and number of steps; only the packing differs.")
print("%-8s %-15s %6s %13s %8s %14s %9s %11s %16s" % (
    "job", "packing", "steps", "useful tokens", "seconds", "useful tok/s", "val loss",
    "dollars", "$ per 1M tokens"))
for name in names:
    job = ctl_json("get", name)
    cks = ctl_json("checkpoints", name).get("checkpoints", [])
    secs = seconds(job["start_time"], job["end_time"]) if "end_time" in job else float("nan")
    tokens = int(job.get("tokens", 0))
    val = cks[-1].get("val_loss", float("nan")) if cks else float("nan")
    usd = job.get("cost", {}).get("cost_usd", 0)
    print("%-8s %-15s %6s %13d %8.1f %14.0f %9.4f %11.6f %16.6f" % (
        name, job["spec"]["data"].get("packing", "?").replace("PACKING_MODE_", "").lower(),
        job.get("step", 0), tokens, secs, tokens / secs if secs else 0, val, usd,
        usd / tokens * 1e6 if tokens else 0))
print("\nThe padded baseline spends most of each row on padding, so in the same steps and")
print("about the same dollars it trains on far fewer real tokens.")
PY
echo
echo "Now one job on both workers: two data-parallel ranks (c10d over Gloo)."
echo "\$ tallyctl submit -f examples/jobs/tiny-2gpu.yaml"
GANG=$("$TALLYCTL" submit -f examples/jobs/tiny-2gpu.yaml)
echo "$GANG"
"$TALLYCTL" watch "$GANG" | sed -u 's/^/[2 ranks] /' || true
grep -ho "rank [01] of 2 over [a-z]* ([^)]*)" "$DEMO"/worker-*.log | sort -u || true
echo
echo "Last, the question Tally exists to answer: which recipe reaches the quality we"
echo "need for the fewest dollars? An experiment trains four recipes of one model and"
echo "judges each by its dollars to the final validation loss of the naive one."
echo "\$ tallyctl experiment create -f examples/experiments/recipe-ab.yaml"
EXP=$("$TALLYCTL" experiment create -f examples/experiments/recipe-ab.yaml)
echo "$EXP"
echo "\$ tallyctl experiment watch $EXP"
"$TALLYCTL" experiment watch "$EXP" || true
echo
echo "\$ tallyctl experiment report $EXP --svg=$DEMO/recipe-ab.svg"
"$TALLYCTL" experiment report "$EXP" --svg="$DEMO/recipe-ab.svg" | tail -1
/usr/bin/python3 - "$TALLYCTL" "$EXP" <<'PY'
import json, subprocess, sys
ctl, name = sys.argv[1:]
e = json.loads(subprocess.run([ctl, "experiment", "get", name, "--output=json"], check=True,
                              capture_output=True, text=True).stdout)
ref = next(v for v in e["variants"] if v["name"] == e["reference_variant"])
reached = [v for v in e["variants"] if v["reached_target"] and v["name"] != ref["name"]
           and v.get("recipe_cost_to_target_usd")]
if not ref["reached_target"] or not ref.get("recipe_cost_to_target_usd") or not reached:
    print("No variant other than %s reached the target: no saving to report." % ref["name"])
    sys.exit(0)
best = min(reached, key=lambda v: v["recipe_cost_to_target_usd"])
r_ref, r_best = ref["recipe_cost_to_target_usd"], best["recipe_cost_to_target_usd"]
b_ref, b_best = ref.get("cost_to_target_usd", 0), best.get("cost_to_target_usd", 0)
cal = e.get("calibration", {})
timing = ("every variant's step timed back to back on one worker by %s, so that the"
          " machine's load weighs on all alike" % cal["job"] if cal.get("times")
          else "each variant's own median step time, which depends on what ran beside it")
print("Combined saving, by recipe cost (steps to the target x a step's time x its price;"
      "\n%s):\n%s needs $%.6f to reach its"
      " own final loss %.4f;\n%s reaches it for $%.6f (%.1f steps, $%.6f to $%.6f): %.2fx"
      " cheaper." % (timing, ref["name"], r_ref, e["target_val_loss"], best["name"], r_best,
                     best.get("steps_to_target", 0), best.get("recipe_cost_low_usd", 0),
                     best.get("recipe_cost_high_usd", 0), r_ref / r_best))
if cal.get("times"):
    print("The timing calibration cost $%.6f of the experiment's $%.6f."
          % (cal.get("cost_usd", 0), e.get("cost_usd", 0)))
if b_ref > 0 and b_best > 0:
    print("Billed (what the ledger charged, with the machine's load in it): $%.6f and $%.6f,"
          " %.2fx." % (b_ref, b_best, b_ref / b_best))
print("One seed each: a ratio from one run is one sample. With `replicates: 3` in the file"
      " each variant\nruns three times and the verdict says \"cheaper\" only when the 90%"
      " interval of its ratio is\nbelow 1 (bench/replicates.sh: packed 0.59x, 0.47x-0.74x;"
      " packed-moe 0.75x, 0.56x-1.02x).")
PY
echo
echo "From /metrics:"
curl -s "http://$METRICS/metrics" | grep -E '^tally_(jobs|attempts_ended_total|worker_slots|cost_dollars_total)' || true
