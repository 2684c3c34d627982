#!/usr/bin/env bash
# The demo's recipe experiment (examples/experiments/recipe-ab.yaml: naive =
# padded to seq_len, packed, packed MoE, packed MoE with the forecast stop;
# target: naive's final validation loss) with every variant run REPLICATES
# times (training.seed 1, 2, ...), on one tallyd and two one-thread CPU
# workers: the per-run table, then each variant's mean and 90% interval and
# its verdict, from tallyctl.
#   bench/replicates.sh               # 3 replicates (about 8 minutes here)
#   REPLICATES=5 bench/replicates.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
OUT=$B/bench/replicates
REPLICATES=${REPLICATES:-3}
mkdir -p "$OUT"

. bench/lib/models.sh
ensure_fortunes
. bench/lib/cluster.sh
start_cluster "$OUT" 2

sed "s|build/demo/fortunes/train|$B/demo/fortunes/train|" examples/experiments/recipe-ab.yaml \
  >"$OUT/recipe-ab.yaml"
echo "replicates: $REPLICATES" >>"$OUT/recipe-ab.yaml"
TALLYCTL="$B/cli/tallyctl"
start=$SECONDS
exp=$("$TALLYCTL" experiment create -f "$OUT/recipe-ab.yaml")
"$TALLYCTL" experiment watch "$exp" >"$OUT/events" || true
echo "== $exp: recipe-ab x $REPLICATES replicates, $((SECONDS - start)) s on two workers =="
"$TALLYCTL" experiment get "$exp"
"$TALLYCTL" experiment report "$exp" --svg="$OUT/recipe-ab.svg" | tail -1
