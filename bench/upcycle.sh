#!/usr/bin/env bash
# Sparse upcycling, judged by dollars: a dense model (bench/upcycle/dense.yaml,
# 600 steps on fortunes, trained here with tally-train unless its checkpoint
# exists) is continued three ways with the same budget each, as the
# experiment examples/experiments/upcycle.yaml: dense, upcycled to 8 experts
# top-2, and the same MoE from scratch; the target is the continued dense
# model's final loss. One tallyd and two one-thread CPU workers; prints the
# experiment's table and writes its SVG under $OUT.
#   bench/upcycle.sh        # about 10 minutes here
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
OUT=$B/bench/upcycle
mkdir -p "$OUT"
. bench/lib/models.sh
ensure_dense

. bench/lib/cluster.sh
start_cluster "$OUT" 2
TALLYCTL="$B/cli/tallyctl"
echo "== examples/experiments/upcycle.yaml =="
start=$SECONDS
exp=$("$TALLYCTL" experiment create -f examples/experiments/upcycle.yaml)
"$TALLYCTL" experiment watch "$exp" >"$OUT/events" || true
echo "$((SECONDS - start)) wall seconds"
"$TALLYCTL" experiment report "$exp" --svg="$OUT/upcycle.svg"
