#!/usr/bin/env bash
# Benchmarks, side by side in one run: the trainer's packing against both
# padded baselines (same model, corpus and steps), then the controller: submit
# throughput and latency on loopback (SQLite and in-memory stores, 1/8/64
# clients), the scheduler's Tick() and /metrics rendering at fleet scale.
# ONLY=packing, ONLY=fp8, ONLY=moe, ONLY=dp, ONLY=watch (bench/watch_load.py:
# idle and live WatchJob streams), ONLY=cost_to_target (recipe experiments
# on two corpora), ONLY=packing_efficiency (packed vs padded by tokens and
# steps to the same loss, three corpora x seeds), ONLY=replicates (the demo's
# experiment with each variant
# run three times: means, 90% intervals and verdicts), ONLY=timing_calibration
# (recipe prices with and without the timing calibration, under load),
# ONLY=eval_sample (the
# evaluation sample against the whole validation split on three corpora),
# ONLY=upcycle (dense vs upcycled vs MoE from scratch at one budget),
# ONLY=distill (a student with and without a teacher), ONLY=gguf_serving
# (llama.cpp's tokens/s and file sizes of F16, Q8_0 and Q4_0 exports),
# ONLY=qat_quality (plain, post-training quantized and QAT losses over seeds
# and corpora, and QAT's step cost), ONLY=qat_target (dollars to a quantized
# loss: post-training quantization against QAT) or ONLY=controller runs one
# part.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD_DIR:-build}
SECONDS_EACH=${SECONDS_EACH:-5}
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT

ONLY=${ONLY:-}
if [ -z "$ONLY" ] || [ "$ONLY" = packing ]; then
  echo "== Packing: useful tokens/s, packed vs padded baselines (fortunes corpus) =="
  if [ ! -s "$B/demo/fortunes/train.idx" ]; then
    "$B/cli/tally-prep" --out="$B/demo/fortunes" /usr/share/games/fortunes/*.u8
  fi
  "$B/bench/packing_bench" --train_path="$B/demo/fortunes/train" ${PACKING_ARGS:-}
  echo
fi
[ "$ONLY" = packing ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = fp8 ]; then
  echo "== FP8 vs BF16 and FP32: matrix products and training steps =="
  "$B/bench/fp8_bench" --train_path="$B/demo/fortunes/train"
  echo
fi
[ "$ONLY" = fp8 ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = moe ]; then
  echo "== MoE vs dense at the same active FLOPs per token =="
  "$B/bench/moe_bench" --train_path="$B/demo/fortunes/train"
  echo
fi
[ "$ONLY" = moe ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = dp ]; then
  echo "== Data parallel: one process against two ranks (c10d, Gloo) =="
  bench/dp_bench.sh "$B"
  echo
fi
[ "$ONLY" = dp ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = watch ]; then
  echo "== WatchJob load: 10,000 idle + 1,000 live watch streams, GetJob latency =="
  /usr/bin/python3 bench/watch_load.py --build_dir="$B" ${WATCH_ARGS:-}
  echo
fi
[ "$ONLY" = watch ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = cost_to_target ]; then
  echo "== Cost to target: recipe experiments on two corpora (bench/cost_to_target.sh) =="
  BUILD_DIR="$B" bench/cost_to_target.sh
  echo
fi
[ "$ONLY" = cost_to_target ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = replicates ]; then
  echo "== Replicates: the demo's recipe experiment, each variant three times (bench/replicates.sh) =="
  BUILD_DIR="$B" bench/replicates.sh
  echo
fi
[ "$ONLY" = replicates ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = timing_calibration ]; then
  echo "== Timing calibration: identical variants and the demo, with and without load (bench/timing_calibration.sh) =="
  BUILD_DIR="$B" bench/timing_calibration.sh
  echo
fi
[ "$ONLY" = timing_calibration ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = packing_efficiency ]; then
  echo "== Packing efficiency: tokens and steps to the padded baseline's loss, over seeds (bench/packing_efficiency.sh) =="
  BUILD_DIR="$B" bench/packing_efficiency.sh
  echo
fi
[ "$ONLY" = packing_efficiency ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = eval_sample ]; then
  echo "== Evaluation sample: 25% of the validation documents vs all (bench/eval_sample.sh) =="
  BUILD_DIR="$B" bench/eval_sample.sh
  echo
fi
[ "$ONLY" = eval_sample ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = upcycle ]; then
  echo "== Upcycling: dense, upcycled and MoE from scratch at one budget (bench/upcycle.sh) =="
  BUILD_DIR="$B" bench/upcycle.sh
  echo
fi
[ "$ONLY" = upcycle ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = distill ]; then
  echo "== Distillation: a 1-layer student with and without its teacher (bench/distill.sh) =="
  BUILD_DIR="$B" bench/distill.sh
  echo
fi
[ "$ONLY" = distill ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = gguf_serving ]; then
  echo "== GGUF serving: llama.cpp tokens/s of F16, Q8_0 and Q4_0 exports (bench/gguf_serving.sh) =="
  BUILD_DIR="$B" bench/gguf_serving.sh
  echo
fi
[ "$ONLY" = gguf_serving ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = qat_quality ]; then
  echo "== QAT: what quantization costs and what QAT wins back (bench/qat_quality.sh) =="
  BUILD_DIR="$B" bench/qat_quality.sh
  echo
fi
[ "$ONLY" = qat_quality ] && exit 0

if [ -z "$ONLY" ] || [ "$ONLY" = qat_target ]; then
  echo "== QAT: dollars to a quantized loss, PTQ vs QAT (bench/qat_target.sh) =="
  BUILD_DIR="$B" bench/qat_target.sh
  echo
fi
[ "$ONLY" = qat_target ] && exit 0

echo "== Submit on loopback (${SECONDS_EACH}s per row) =="
printf "store\tclients\tsubmits\tper_s\tp50_ms\tp99_ms\terrors\n"
for store in sqlite memory; do
  "$B/server/tallyd" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --store=$store \
    --data_dir="$tmp/$store" --address_file="$tmp/$store.addr" >"$tmp/$store.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do [ -s "$tmp/$store.addr" ] && break; sleep 0.05; done
  addr=$(sed 's/grpc=\([^ ]*\).*/\1/' "$tmp/$store.addr")
  for c in 1 8 64; do
    printf "%s\t" $store
    "$B/bench/submit_bench" --controller="$addr" --clients=$c --seconds="$SECONDS_EACH"
  done
  kill -TERM $pid; wait $pid || true
done
echo
echo "== Scheduler and /metrics =="
"$B/bench/scheduler_bench" --benchmark_counters_tabular=true
