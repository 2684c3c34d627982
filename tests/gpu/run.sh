#!/usr/bin/env bash
# The GPU checks, in one call on a GPU machine (carry tests/gpu/.debs and
# build/demo/fortunes, made by tests/gpu/fetch-deps.sh): builds the trainer
# against that machine's LibTorch with CUDA, runs the CPU unit tests of the
# model and data there, the CUDA-vs-CPU parity tests, then the packing benchmark on
# the GPU at transformer scale (the parity test includes a one-rank NCCL
# group). Results go to $OUT; a short table prints last.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/tally-gpu-out}
mkdir -p "$OUT"
PREFIX=/tmp/tally-gpu-prefix
rm -rf "$PREFIX" && mkdir -p "$PREFIX"
for d in tests/gpu/.debs/*.deb; do dpkg -x "$d" "$PREFIX"; done
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
PY=${TORCH_PYTHON:-/opt/torch/.venv/bin/python}
TORCH_CMAKE=$("$PY" -c 'import torch;print(torch.utils.cmake_prefix_path)')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"

# Torch's CMake ignores CMAKE_CUDA_ARCHITECTURES and would add every
# architecture it knows, some of which nvcc 13 no longer compiles.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTALLY_TRAINER_ONLY=ON -DTALLY_TORCH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$TORCH_CMAKE;$PREFIX/usr" \
  -DOPENSSL_ROOT_DIR="$PREFIX/usr" 2>&1 | tail -5 | tee "$OUT/cmake.log"
ninja -C build-gpu kernels_test data_test model_test precision_test dist_test cuda_parity_test packing_bench \
  fp8_bench \
  2>&1 | tail -3 | tee "$OUT/build.log"

# The CPU tests that need no fortunes package, then the CUDA checks.
for t in kernels/kernels_test "worker/data/data_test --gtest_filter=-*Fortunes*" worker/model/model_test \
         worker/precision/precision_test worker/dist/dist_test tests/gpu/cuda_parity_test; do
  name=$(basename ${t%% *})
  if build-gpu/$t >"$OUT/$name.log" 2>&1; then echo "$name: passed"; else
    echo "$name: FAILED"; fi
done | tee "$OUT/summary.txt"
grep -hE "max diff|max \||CUDA training|NCCL|MoE layer|grouped expert products are off" "$OUT/cuda_parity_test.log" | tee -a "$OUT/summary.txt" || true

build-gpu/bench/packing_bench --device=cuda:0 --train_path=build/demo/fortunes/train \
  --d_model=1024 --layers=8 --seq_len=2048 --rows=8 --steps=30 | tee "$OUT/packing_bench.md"
# FP8 (at::_scaled_mm) against BF16 at transformer shapes, and whole steps.
build-gpu/bench/fp8_bench --device=cuda:0 --tokens=8192 --d_in=4096 --d_out=4096 --reps=20 \
  --train_path=build/demo/fortunes/train --steps=30 | tee "$OUT/fp8_bench.md"
echo
cat "$OUT/summary.txt"
grep -q FAILED "$OUT/summary.txt" && exit 1 || exit 0
