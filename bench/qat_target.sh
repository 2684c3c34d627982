#!/usr/bin/env bash
# Dollars to a served quality: examples/experiments/qat-vs-ptq.yaml (plain
# training + post-training Q4_0 against Q4_0 quantization-aware training,
# two replicates each, target: the plain recipe's final quantized_val_loss)
# on one tallyd and two one-thread CPU workers; prints each variant's
# quantized losses, dollars to the target and the experiment's verdict.
#   bench/qat_target.sh            # about 5 minutes here
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
OUT=$B/bench/qat_target
mkdir -p "$OUT"

. bench/lib/models.sh
ensure_fortunes
. bench/lib/cluster.sh
start_cluster "$OUT" 2

TALLYCTL="$B/cli/tallyctl"
exp=$("$TALLYCTL" experiment create -f examples/experiments/qat-vs-ptq.yaml)
"$TALLYCTL" experiment watch "$exp" >"$OUT/events" || true
"$TALLYCTL" experiment report "$exp" | tee "$OUT/report.txt"
