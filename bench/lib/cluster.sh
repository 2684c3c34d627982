# Sourced by benches that run experiments: start_cluster OUT N starts one
# tallyd (data under OUT/tallyd, examples/tallyd.yaml's prices) and N
# one-thread CPU workers (checkpoints under OUT/checkpoints), exports
# TALLY_CONTROLLER, and stops them all when the calling script exits.
# Needs B (the build folder).
cluster_pids=()
stop_cluster() {
  for p in "${cluster_pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
start_cluster() {
  local out=$1 workers=$2
  rm -rf "$out/tallyd" "$out/checkpoints" && mkdir -p "$out/tallyd"
  trap stop_cluster EXIT
  "$B/server/tallyd" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
    --data_dir="$out/tallyd" --address_file="$out/tallyd/addr" \
    --config=examples/tallyd.yaml >"$out/tallyd.log" 2>&1 &
  cluster_pids+=($!)
  for _ in $(seq 200); do [ -s "$out/tallyd/addr" ] && break; sleep 0.05; done
  TALLY_CONTROLLER=$(sed 's/grpc=\([^ ]*\).*/\1/' "$out/tallyd/addr")
  export TALLY_CONTROLLER
  for i in $(seq 0 $((workers - 1))); do
    "$B/worker/tally-worker" --worker_id="bench-cpu-$i" --threads=1 \
      --checkpoint_dir="$out/checkpoints" >"$out/worker-$i.log" 2>&1 &
    cluster_pids+=($!)
  done
}
