#!/usr/bin/env bash
# Two controllers side by side in one run, as the README's comparison rows
# are measured: each checkout's tallyd in turn under the same submit_bench,
# then each checkout's scheduler_bench, twice, back to back.
#
#   bench/side_by_side.sh OLD_BUILD_DIR NEW_BUILD_DIR [SECONDS]
#
# A build dir is a configured and built checkout's build/ (tallyd,
# bench/submit_bench, bench/scheduler_bench); e.g. for an older commit:
#   git worktree add /tmp/old COMMIT && cmake -S /tmp/old -B /tmp/old/build -G Ninja \
#     -DTALLY_LIBTORCH_DIR=... && cmake --build /tmp/old/build --target tallyd \
#     submit_bench scheduler_bench
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 OLD_BUILD_DIR NEW_BUILD_DIR [SECONDS]" >&2; exit 2; }
OLD=$1 NEW=$2 SECONDS_EACH=${3:-4}
for b in "$OLD" "$NEW"; do
  for t in server/tallyd bench/submit_bench bench/scheduler_bench; do
    [ -x "$b/$t" ] || { echo "$b/$t: not built" >&2; exit 2; }
  done
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

submits() {  # label build_dir store clients
  local d="$tmp/$1-$3-$4"
  rm -rf "$d" && mkdir -p "$d"
  "$2/server/tallyd" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --store="$3" \
    --data_dir="$d" --address_file="$d/addr" >"$d/log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do [ -s "$d/addr" ] && break; sleep 0.05; done
  local addr
  addr=$(sed 's/grpc=\([^ ]*\).*/\1/' "$d/addr")
  printf "%s\t%s\t" "$1" "$3"
  "$2/bench/submit_bench" --controller="$addr" --clients="$4" --seconds="$SECONDS_EACH"
  kill -TERM $pid
  wait $pid || true
}

echo "== submits, each controller in turn (${SECONDS_EACH}s per row) =="
printf "build\tstore\tclients\tsubmits\tper_s\tp50_ms\tp99_ms\terrors\n"
for store in sqlite memory; do
  for c in 1 8; do
    submits old "$OLD" $store $c
    submits new "$NEW" $store $c
  done
done
echo
echo "== scheduler and /metrics, back to back, twice =="
for round in 1 2; do
  for b in old new; do
    dir=$OLD; [ $b = new ] && dir=$NEW
    "$dir/bench/scheduler_bench" --benchmark_filter='Tick|Metrics' 2>/dev/null |
      awk -v b=$b '/^BM_/ {print b "\t" $1 "\t" $2 " " $3}'
  done
done
