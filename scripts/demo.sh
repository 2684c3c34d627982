#!/usr/bin/env bash
# `make demo`: tallyd and one worker on this machine, a job submitted with
# tallyctl and followed to its end, then what tallyd recorded and exports.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
DEMO=$B/demo
rm -rf "$DEMO/tallyd" && mkdir -p "$DEMO/tallyd"
pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

"$B/server/tallyd" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --data_dir="$DEMO/tallyd" --address_file="$DEMO/tallyd/addr" >"$DEMO/tallyd.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$DEMO/tallyd/addr" ] && break; sleep 0.05; done
GRPC=$(sed 's/grpc=\([^ ]*\).*/\1/' "$DEMO/tallyd/addr")
METRICS=$(sed 's/.*metrics=//' "$DEMO/tallyd/addr")
export TALLY_CONTROLLER=$GRPC
echo "tallyd: gRPC $GRPC, metrics http://$METRICS/metrics (log: $DEMO/tallyd.log)"

"$B/worker/tally-worker" --worker_id=demo-cpu-0 --placeholder_step_time=50ms \
  >"$DEMO/worker.log" 2>&1 &
pids+=($!)
echo "tally-worker: demo-cpu-0 (log: $DEMO/worker.log)"
echo
echo "NOTE: this build's worker is a placeholder: it walks a job's steps and"
echo "reports that it trained nothing. Training, packing and costs arrive with"
echo "the trainer and the cost ledger."
echo

TALLYCTL="$B/cli/tallyctl"
echo "\$ tallyctl submit -f examples/jobs/tiny.yaml"
JOB=$("$TALLYCTL" submit -f examples/jobs/tiny.yaml)
echo "$JOB"
echo "\$ tallyctl watch $JOB"
"$TALLYCTL" watch "$JOB" || true
echo
echo "\$ tallyctl get $JOB"
"$TALLYCTL" get "$JOB"
echo
echo "\$ tallyctl list"
"$TALLYCTL" list
echo
echo "From /metrics:"
curl -s "http://$METRICS/metrics" | grep -E '^tally_(jobs|queue_depth|worker_slots|attempts_ended_total)' || true
