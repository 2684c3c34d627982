#!/usr/bin/env bash
# The GPU checks in one call, within a time budget (tests/gpu/EXPECTED.md says
# what each should show, per card).
#
#   tests/gpu/run.sh               on a GPU machine: carry tests/gpu/.debs and
#                                  build/demo/fortunes (tests/gpu/fetch-deps.sh)
#   QUICK=1 tests/gpu/run.sh       the same in under 4 minutes: smaller
#                                  benchmark shapes, fewer steps
#   tests/gpu/run.sh --rehearse    on a machine with nvcc and no GPU (make
#                                  gpu-rehearsal): the same preflight,
#                                  configure and build against a fresh venv
#                                  with `pip install torch==2.11.0` and only the
#                                  carried .debs; GPU steps skip, the
#                                  benchmarks run on the CPU at toy shapes.
#   --card=h100|h100-pcie|h100-nvl|h200|h200-nvl (or TALLY_GPU_CARD)
#                                  takes that card's code path whatever
#                                  nvidia-smi says (the rehearsal's way to
#                                  plan for each card; on a GPU, a test).
#
# The card: its name and memory from nvidia-smi (torch where nvidia-smi is
# missing) pick its entry in card_spec below: dense peak TFLOP/s for MFU and
# its price key in examples/tallyd.yaml (usd_per_gpu_hour). Its memory sizes
# the micro-batches of the 1B and 3B step timings (plan_rows: what an FP8
# step holds, counted conservatively), keeping the tokens per step of the
# plan and splitting them into more micro-batches where rows do not fit.
#
# Steps: a preflight (about 10 s) that stops at once, naming what is missing;
# the carried .debs unpacked into a prefix; configure (trainer only, CUDA
# LibTorch, -g1 so the sync audit can name source lines); build only what
# runs (kernels_test, cuda_parity_test, sync_audit, step_bench, target_bench,
# fp8_bench, packing_bench, grow_bench; ninja -k 0, so one broken target does
# not stop the rest); the kernels' tests, the CUDA parity test (current
# weights every step, nothing waiting for the host in forward or backward),
# the sync audit (every host synchronisation of a training step in CUDA's
# sync-debug mode, counted per step and listed with its source line), then
# the benchmarks: step time at 1B and 3B (BF16 vs FP8, MFU two ways),
# dollars to naive's loss (target_bench), FP8 products, packing, upcycling
# and distillation step times (grow_bench). Every step's log is written in
# full under $OUT; a failed step is recorded and the rest go on, each under
# a timeout cut to the time left of BUDGET_S, and a step that no longer
# fits is recorded as "skipped: time", never run over. Two tables are
# printed last (also $OUT/summary.md): the steps, and the numbers (card,
# price and peaks, MFU both ways and FP8/BF16 at 1B and 3B, syncs per step,
# dollars to naive's loss); the full numbers are in $OUT/results.md and the
# plan in $OUT/plan.md. Exit status: 0 when nothing failed, 1 when a step
# failed, 2 when the preflight or configure failed.
#
# Environment: OUT (default /tmp/tally-gpu-out), QUICK, BUDGET_S (default 450,
# so the whole command fits 8 minutes on either card; QUICK 200; rehearsal
# 3600), JOBS (default nproc), GPU_BUILD_DIR (build-gpu; rehearsal
# build-gpu-rehearsal), TORCH_PYTHON (default /opt/torch/.venv/bin/python;
# rehearsal: a fresh venv, or the previous rehearsal's with
# TALLY_REHEARSAL_VENV=keep), TALLY_CACHE_DIR (the rehearsal's wheelhouse and
# venv, default ~/.cache/tally), TALLY_CUDA_ARCHITECTURES (default 90),
# TALLY_GPU_CARD (as --card).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
START=$(date +%s)

REHEARSE=0
CARD_FORCED=${TALLY_GPU_CARD:-}
usage() {
  echo "usage: tests/gpu/run.sh [--rehearse] [--card=h100|h100-pcie|h100-nvl|h200|h200-nvl]" \
    "  (environment: QUICK=1, OUT, BUDGET_S, JOBS, TALLY_GPU_CARD)" >&2
  exit 2
}
for arg in "$@"; do
  case "$arg" in
    --rehearse) REHEARSE=1 ;;
    --card=*) CARD_FORCED=${arg#--card=} ;;
    *) usage ;;
  esac
done

# card_spec CARD: the card's name, dense peaks in TFLOP/s (BF16, FP8), its
# key in examples/tallyd.yaml's usd_per_gpu_hour and its memory in MiB as
# nvidia-smi reports it (used when the card is forced, not detected).
# Dense peaks are half the "with sparsity" figures of NVIDIA's datasheets:
# H100 (nvidia.com/en-us/data-center/h100, "H100 Tensor Core GPU" datasheet):
# SXM BF16 1,979 / FP8 3,958 -> 989 / 1979; PCIe 1,513 / 3,026 -> 756 / 1513;
# NVL 1,671 / 3,341 -> 835 / 1671. H200 (nvidia.com/en-us/data-center/h200,
# datasheet): SXM the same as H100 SXM (989 / 1979), NVL the same as H100 NVL
# (835 / 1671); it differs in memory (141 GB HBM3e, 4.8 TB/s).
card_spec() {
  case "$1" in
    h100)      CARD_LABEL="H100 SXM";  PEAK_BF16=989; PEAK_FP8=1979; PRICE_KEY=h100; NOMINAL_MIB=81559 ;;
    h100-pcie) CARD_LABEL="H100 PCIe"; PEAK_BF16=756; PEAK_FP8=1513; PRICE_KEY=h100; NOMINAL_MIB=81559 ;;
    h100-nvl)  CARD_LABEL="H100 NVL";  PEAK_BF16=835; PEAK_FP8=1671; PRICE_KEY=h100; NOMINAL_MIB=95830 ;;
    h200)      CARD_LABEL="H200 SXM";  PEAK_BF16=989; PEAK_FP8=1979; PRICE_KEY=h200; NOMINAL_MIB=143771 ;;
    h200-nvl)  CARD_LABEL="H200 NVL";  PEAK_BF16=835; PEAK_FP8=1671; PRICE_KEY=h200; NOMINAL_MIB=143771 ;;
    *) return 1 ;;
  esac
}
# card_of_name NAME: nvidia-smi's (or torch's) device name -> a card_spec key,
# empty for a card this script has no entry for.
card_of_name() {
  case "$(echo "$1" | tr '[:upper:]' '[:lower:]')" in
    *h200*nvl*) echo h200-nvl ;;
    *h200*) echo h200 ;;
    *h100*nvl*) echo h100-nvl ;;
    *h100*pcie*) echo h100-pcie ;;
    *h100*) echo h100 ;;
  esac
}
if [ -n "$CARD_FORCED" ] && ! card_spec "$CARD_FORCED"; then
  echo "run.sh: unknown card '$CARD_FORCED'" >&2
  usage
fi
QUICK=${QUICK:-0}
TORCH_VERSION=2.11.0   # the GPU machine's torch; scripts/setup.sh pins the same
if [ "$REHEARSE" = 1 ]; then
  BUDGET_S=${BUDGET_S:-3600}
  B=${GPU_BUILD_DIR:-build-gpu-rehearsal}
else
  BUDGET_S=${BUDGET_S:-$([ "$QUICK" = 1 ] && echo 200 || echo 450)}
  B=${GPU_BUILD_DIR:-build-gpu}
fi
OUT=${OUT:-/tmp/tally-gpu-out}
mkdir -p "$OUT" "$B"
OUT=$(cd "$OUT" && pwd)
B=$(cd "$B" && pwd)
PREFIX=$B/carried
JOBS=${JOBS:-$(nproc)}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
TARGETS=(kernels_test cuda_parity_test sync_audit step_bench target_bench fp8_bench packing_bench
  grow_bench)
# QUICK: the correctness checks, the sync audit, one small step timing and a
# small dollars run; fewer links too.
[ "$QUICK" = 1 ] && TARGETS=(kernels_test cuda_parity_test sync_audit step_bench target_bench)
FORTUNES=$ROOT/build/demo/fortunes/train

# ---- the table -------------------------------------------------------------
NAMES=() STATES=() SECS=() NOTES=()
FAILED=0
record() {  # record NAME STATE SECONDS NOTE
  NAMES+=("$1") STATES+=("$2") SECS+=("$3") NOTES+=("$4")
  [ "$2" = FAIL ] && FAILED=1
  printf '== %-24s %-5s %4ss  %s\n' "$1" "$2" "$3" "$4"
}
# The numbers table: NUMBER_NAMES / NUMBER_VALUES, filled by numbers().
NUMBER_NAMES=() NUMBER_VALUES=()
number() { NUMBER_NAMES+=("$1") NUMBER_VALUES+=("$2"); }
table() {
  {
    echo "| step | result | s | note |"
    echo "|---|---|---|---|"
    local i
    for i in "${!NAMES[@]}"; do
      echo "| ${NAMES[$i]} | ${STATES[$i]} | ${SECS[$i]} | ${NOTES[$i]} |"
    done
    echo "| total | $([ "$FAILED" = 0 ] && echo ok || echo FAIL) | $(( $(date +%s) - START )) |" \
      "$([ "$REHEARSE" = 1 ] && echo rehearsal, no GPU || echo "budget ${BUDGET_S} s")$([ "$QUICK" = 1 ] && echo ", QUICK") |"
    if [ ${#NUMBER_NAMES[@]} -gt 0 ]; then
      echo
      echo "| ${CARD_LABEL:-card} | |"
      echo "|---|---|"
      for i in "${!NUMBER_NAMES[@]}"; do
        echo "| ${NUMBER_NAMES[$i]} | ${NUMBER_VALUES[$i]} |"
      done
    fi
  } >"$OUT/summary.md"
  echo
  cat "$OUT/summary.md"
}
finish() { table; exit "$1"; }
elapsed() { echo $(( $(date +%s) - $1 )); }
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }

# step NAME MIN_S MAX_S CMD...: runs CMD under a timeout of MAX_S cut to the
# budget left, its output in full in $OUT/NAME.log (and on the terminal);
# skipped when less than MIN_S is left. Sets STEP_RC.
step() {
  local name=$1 min=$2 max=$3
  shift 3
  local l t0
  l=$(left)
  if [ "$l" -lt "$min" ]; then
    record "$name" skip 0 "skipped: time (${l}s of the ${BUDGET_S}s budget left, needs ${min}s)"
    STEP_RC=125
    return
  fi
  # The rehearsal's CPU runs of GPU steps (toy shapes, a shared machine)
  # get four times the GPU's limits; its budget is an hour.
  [ "$REHEARSE" = 1 ] && max=$((max * 4))
  [ "$max" -gt $((l - 5)) ] && max=$((l - 5))
  t0=$(date +%s)
  echo "== $name: $* (timeout ${max}s)" | tee "$OUT/$name.log"
  timeout --kill-after=10 "$max" "$@" 2>&1 | tee -a "$OUT/$name.log"
  STEP_RC=${PIPESTATUS[0]}
  STEP_S=$(elapsed "$t0")
  if [ "$STEP_RC" = 124 ] || [ "$STEP_RC" = 137 ]; then
    record "$name" FAIL "$STEP_S" "timed out after ${max}s ($name.log)"
    STEP_RC=124
  fi
}

# ---- preflight: everything the run needs, before any of it starts --------
t0=$(date +%s)
PF=$OUT/preflight.log
: >"$PF"
missing=()
need() { missing+=("$1"); echo "MISSING: $1" >>"$PF"; }
have() { echo "ok: $1" >>"$PF"; }

NVCC=${CUDACXX:-$(command -v nvcc || true)}
[ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ] && NVCC=/usr/local/cuda/bin/nvcc
if [ -n "$NVCC" ] && [ -x "$NVCC" ]; then
  NVCC_VERSION=$("$NVCC" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  have "nvcc $NVCC_VERSION at $NVCC"
  CUDA_INC=$(cd "$(dirname "$NVCC")/../include" 2>/dev/null && pwd)
  for h in cuda_runtime.h cublas_v2.h cublasLt.h cusparse.h cusolverDn.h curand.h cufft.h; do
    if [ -f "$CUDA_INC/$h" ]; then have "$h"; else need "$h in $CUDA_INC (the CUDA toolkit's headers)"; fi
  done
else
  need "nvcc (not in PATH, nor /usr/local/cuda/bin; or set CUDACXX)"
  CUDA_INC=/usr/local/cuda/include
fi
for tool in cmake ninja g++ dpkg-deb timeout; do
  if command -v "$tool" >/dev/null; then have "$tool"; else need "$tool"; fi
done
if command -v cmake >/dev/null; then
  cv=$(cmake --version | sed -n 's/cmake version \([0-9]*\.[0-9]*\).*/\1/p')
  if printf '3.25\n%s\n' "$cv" | sort -V -C; then have "cmake $cv"; else need "cmake >= 3.25 (found $cv)"; fi
fi

# The torch venv. Rehearsal: a fresh one, `pip install torch==$TORCH_VERSION`
# from a wheelhouse that `pip download` fills once (offline afterwards).
if [ "$REHEARSE" = 1 ]; then
  CACHE=${TALLY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tally}/gpu-rehearsal
  WHEELS=$CACHE/wheels-$TORCH_VERSION
  VENV=$CACHE/venv
  PY=$VENV/bin/python
  tv=$(date +%s)
  # TALLY_REHEARSAL_VENV=keep (make gpu-rehearsal's second card): the venv
  # the previous rehearsal made fresh, when it holds this torch.
  if [ "${TALLY_REHEARSAL_VENV:-}" = keep ] &&
     "$PY" -c "import torch, sys; sys.exit(not torch.__version__.startswith('$TORCH_VERSION'))" \
       >/dev/null 2>&1; then
    record venv ok 0 "kept from the previous rehearsal (TALLY_REHEARSAL_VENV=keep): torch==$TORCH_VERSION"
  else
    {
      if ! ls "$WHEELS"/torch-"$TORCH_VERSION"-*.whl >/dev/null 2>&1; then
        echo "rehearsal: downloading torch==$TORCH_VERSION and its dependencies into $WHEELS (once)"
        python3 -m pip download --quiet --dest "$WHEELS.partial" "torch==$TORCH_VERSION" &&
          rm -rf "$WHEELS" && mv "$WHEELS.partial" "$WHEELS"
      fi
      rm -rf "$VENV" && python3 -m venv "$VENV" &&
        "$VENV/bin/pip" install --quiet --no-index --find-links "$WHEELS" "torch==$TORCH_VERSION"
    } >"$OUT/venv.log" 2>&1
    rc=$?
    record venv "$([ $rc = 0 ] && echo ok || echo FAIL)" "$(elapsed "$tv")" \
      "fresh venv, pip install torch==$TORCH_VERSION --no-index from $(basename "$WHEELS") ($(du -sh "$VENV" 2>/dev/null | cut -f1))"
  fi
  t0=$(date +%s)
else
  PY=${TORCH_PYTHON:-/opt/torch/.venv/bin/python}
fi
TORCH_CMAKE=""
if [ -x "$PY" ]; then
  if tinfo=$(timeout 30 "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.utils.cmake_prefix_path)' 2>>"$PF"); then
    read -r TV TCUDA TORCH_CMAKE <<<"$tinfo"
    case "$TV" in
      "$TORCH_VERSION"*) have "torch $TV (CUDA $TCUDA), cmake_prefix_path $TORCH_CMAKE" ;;
      *) need "torch $TORCH_VERSION in $PY (found $TV)" ;;
    esac
    [ "$TCUDA" = None ] && need "a CUDA build of torch in $PY (torch.version.cuda is None)"
    [ -f "$TORCH_CMAKE/Torch/TorchConfig.cmake" ] || need "$TORCH_CMAKE/Torch/TorchConfig.cmake"
  else
    need "import torch in $PY (see preflight.log)"
  fi
else
  need "the torch venv's python at $PY (set TORCH_PYTHON)"
fi
TORCH_SITE=$(dirname "$(dirname "$TORCH_CMAKE")")   # .../site-packages/torch
NCCL_H=""
for d in "$CUDA_INC" /usr/local/cuda/include /usr/include "$TORCH_SITE/../nvidia/nccl/include"; do
  [ -f "$d/nccl.h" ] && { NCCL_H=$d/nccl.h; break; }
done
if [ -n "$NCCL_H" ]; then have "nccl.h at $NCCL_H"; else
  need "nccl.h (CUDA include, /usr/local/cuda/include or the venv's nvidia/nccl/include)"; fi

# The carried Debian packages, unpacked into a prefix.
if [ -f tests/gpu/.debs/PACKAGES ]; then
  while read -r p; do
    [ -z "$p" ] && continue
    if ls tests/gpu/.debs/"${p}"_*.deb >/dev/null 2>&1; then have "carried $p"
    else need "tests/gpu/.debs/${p}_*.deb (run tests/gpu/fetch-deps.sh, carry tests/gpu/.debs)"; fi
  done <tests/gpu/.debs/PACKAGES
  rm -rf "$PREFIX" && mkdir -p "$PREFIX"
  for d in tests/gpu/.debs/*.deb; do dpkg-deb -x "$d" "$PREFIX" || need "unpacking $d"; done
  # Their shared libraries must load here: no newer glibc than this one's.
  glibc=$(getconf GNU_LIBC_VERSION | awk '{print $2}')
  wants=$(find "$PREFIX" -name '*.so*' -type f -exec objdump -T {} + 2>/dev/null |
    grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
  if [ -n "$wants" ] && ! printf '%s\n%s\n' "$wants" "$glibc" | sort -V -C; then
    need "glibc >= $wants for the carried libraries (this machine: $glibc)"
  else have "glibc $glibc (carried libraries need ${wants:-none})"; fi
else
  need "tests/gpu/.debs/PACKAGES (run tests/gpu/fetch-deps.sh, carry tests/gpu/.debs)"
fi
if [ -s "$FORTUNES.idx" ] && [ -s "${FORTUNES%train}val.idx" ]; then have "dataset $FORTUNES"
else need "$FORTUNES.idx and val.idx (tests/gpu/fetch-deps.sh; carry build/demo/fortunes)"; fi

# The card: name and memory (MiB) of the first GPU, from nvidia-smi, else
# from torch.
GPU="" GPU_NAME="" GPU_MIB=""
if [ "$REHEARSE" = 1 ]; then
  have "rehearsal: no GPU needed"
elif GPU=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>>"$PF" | head -1) &&
     [ -n "$GPU" ]; then
  have "GPU: $GPU"
  echo "$GPU" >"$OUT/gpu.txt"
  IFS=, read -r GPU_NAME GPU_MIB < <(timeout 10 nvidia-smi --query-gpu=name,memory.total \
    --format=csv,noheader,nounits 2>>"$PF" | head -1)
elif [ -x "$PY" ] && tg=$(timeout 60 "$PY" -c 'import torch
p = torch.cuda.get_device_properties(0)
print(f"{p.name},{p.total_memory // 2**20}")' 2>>"$PF") && [ -n "$tg" ]; then
  IFS=, read -r GPU_NAME GPU_MIB <<<"$tg"
  GPU="$GPU_NAME, $GPU_MIB MiB (from torch: no nvidia-smi)"
  have "GPU: $GPU"
  echo "$GPU" >"$OUT/gpu.txt"
else
  need "a GPU (neither nvidia-smi nor torch sees one)"
fi
GPU_NAME=$(echo "$GPU_NAME" | xargs)
GPU_MIB=$(echo "$GPU_MIB" | tr -dc '0-9')
if [ -n "$CARD_FORCED" ]; then
  CARD=$CARD_FORCED
  CARD_HOW="forced (--card=$CARD_FORCED)${GPU_NAME:+; the GPU is $GPU_NAME}"
elif [ -n "$GPU_NAME" ]; then
  CARD=$(card_of_name "$GPU_NAME")
  CARD_HOW="detected: $GPU_NAME"
  if [ -z "$CARD" ]; then
    CARD=h100
    CARD_HOW="$GPU_NAME, which card_spec does not know: priced and peaked as an H100 SXM, so its MFU is not its own"
  fi
else
  CARD=h100
  CARD_HOW="no card named (--card): planned for the smaller h100"
fi
card_spec "$CARD"
# Memory: what the GPU has; a forced card without a GPU, its nominal size.
MEM_MIB=${GPU_MIB:-$NOMINAL_MIB}
PRICE=$(awk -v key="$PRICE_KEY:" '/^usd_per_gpu_hour:/ {p = 1; next} p && /^[^ ]/ {p = 0}
  p && $1 == key {print $2}' examples/tallyd.yaml)
if [ -n "$PRICE" ]; then have "card $CARD ($CARD_HOW): \$$PRICE/h (usd_per_gpu_hour.$PRICE_KEY), peaks $PEAK_BF16/$PEAK_FP8 TFLOP/s, $MEM_MIB MiB"
else need "usd_per_gpu_hour.$PRICE_KEY in examples/tallyd.yaml (the $CARD_LABEL's price)"; fi
avail=$(df -Pk "$B" | awk 'NR==2 {print int($4/1048576)}')
[ "$avail" -ge 4 ] && have "${avail} GiB free for $B" || need "4 GiB free for $B (${avail} GiB)"

if [ ${#missing[@]} -gt 0 ]; then
  record preflight FAIL "$(elapsed "$t0")" "missing: $(IFS=';'; echo "${missing[*]}")"
  finish 2
fi
record preflight ok "$(elapsed "$t0")" \
  "nvcc $NVCC_VERSION, torch $TV, ${GPU:-no GPU}; $(wc -l <tests/gpu/.debs/PACKAGES) carried packages"

# ---- the plan: the card's price and peaks, shapes sized to its memory --------
# plan_rows LAYERS D_MODEL SEQ_LEN ROWS: the rows per micro-batch (ROWS,
# ROWS/2, ... 1) for a step of ROWS rows of SEQ_LEN tokens that fits the
# card, and the micro-batches that keep ROWS rows a step; prints "rows
# micro-batches arithmetic" (rows 0: not even one row fits). Counted
# conservatively: every linear's FP32 master, gradient and AdamW m and v plus
# its BF16/FP8 weight images (18 B a parameter); per token and layer the
# activations the backward keeps, 22 d + 8 d_ff bytes (above
# worker/precision/activation_memory.h's estimates: BF16 20 d + 6 d_ff, FP8
# 19 d + 5 d_ff now that an FP8 linear saves only FP8 copies of its input,
# 30 d + 10 d_ff before); of the card's memory 90% less 3 GB (CUDA context,
# cuBLAS workspace, allocator slack) is usable. d_ff is the model's
# default, 8/3 d rounded up to 32.
plan_rows() {
  awk -v L="$1" -v d="$2" -v s="$3" -v w="$4" -v mib="$MEM_MIB" 'BEGIN {
    f = int((8 * d / 3 + 31) / 32) * 32
    P = L * (4 * d * d + 3 * d * f)
    state = P * 18 / 1e9
    row = s * L * (22 * d + 8 * f) / 1e9
    usable = 0.9 * mib * 1048576 / 1e9 - 3
    r = w
    while (r >= 1 && state + r * row > usable) r = int(r / 2)
    printf "%d %d %.2fB parameters: %.1f GB of state + %d x %.1f GB a row = %.1f GB of %.1f GB usable (%d MiB)\n",
      r, (r > 0 ? w / r : 0), P / 1e9, state, r, row, state + r * row, usable, mib
  }'
}
read -r ROWS_1B MB_1B PLAN_1B < <(plan_rows 20 2048 2048 8)
read -r ROWS_3B MB_3B PLAN_3B < <(plan_rows 26 3072 2048 4)
{
  echo "# Plan for the $CARD_LABEL ($CARD_HOW)"
  echo
  echo "- price: \$$PRICE per GPU-hour (examples/tallyd.yaml usd_per_gpu_hour.$PRICE_KEY)"
  echo "- dense peaks: $PEAK_BF16 TFLOP/s BF16, $PEAK_FP8 TFLOP/s FP8 (MFU's denominators)"
  echo "- memory: $MEM_MIB MiB$([ -z "$GPU_MIB" ] && echo " (nominal: no GPU read)")"
  echo "- 1B step (20 x 2048, 8 rows of 2048 a step): $ROWS_1B rows x $MB_1B micro-batches; $PLAN_1B"
  echo "- 3B step (26 x 3072, 4 rows of 2048 a step): $ROWS_3B rows x $MB_3B micro-batches; $PLAN_3B"
} >"$OUT/plan.md"
record plan ok 0 "$CARD_LABEL, $MEM_MIB MiB, \$$PRICE/h, peaks $PEAK_BF16/$PEAK_FP8; 1B $ROWS_1B rows x $MB_1B, 3B $ROWS_3B rows x $MB_3B (plan.md)"
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- configure --------------------------------------------------------------
# The prefix comes first, and nothing is looked up in CMake's package
# registries; the checks below prove where each package was found.
t0=$(date +%s)
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g1 \
  -DTALLY_TRAINER_ONLY=ON -DTALLY_TORCH_CUDA=ON \
  -DTALLY_CUDA_ARCHITECTURES="${TALLY_CUDA_ARCHITECTURES:-90}" \
  -DCMAKE_CUDA_COMPILER="$NVCC" \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr;$TORCH_CMAKE" \
  -DOPENSSL_ROOT_DIR="$PREFIX/usr" \
  -DOPENSSL_INCLUDE_DIR="$PREFIX/usr/include" \
  -DOPENSSL_CRYPTO_LIBRARY="$PREFIX/usr/lib/x86_64-linux-gnu/libcrypto.so" \
  -DOPENSSL_SSL_LIBRARY="$PREFIX/usr/lib/x86_64-linux-gnu/libssl.so" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
  >"$OUT/configure.log" 2>&1
rc=$?
if [ $rc != 0 ]; then
  grep -A6 -E "CMake Error" "$OUT/configure.log" | head -40
  record configure FAIL "$(elapsed "$t0")" "cmake exited $rc: $(grep -m1 -A2 'CMake Error' "$OUT/configure.log" | tail -1 | sed 's/|/\//g' | cut -c1-160)"
  finish 2
fi
record configure ok "$(elapsed "$t0")" "configure.log"

# Where each package came from.
cache() { sed -n "s|^$1:[A-Z]*=||p" "$B/CMakeCache.txt"; }
bad=()
for v in absl_DIR GTest_DIR nlohmann_json_DIR OPENSSL_INCLUDE_DIR OPENSSL_CRYPTO_LIBRARY \
         TALLY_GLOO_INCLUDE_DIR; do
  val=$(cache "$v")
  case "$val" in "$PREFIX"/*) ;; *) bad+=("$v=${val:-unset}") ;; esac
done
torch_dir=$(cache Torch_DIR)
[ "$(cd "$torch_dir" 2>/dev/null && pwd -P)" = "$(cd "$TORCH_CMAKE/Torch" && pwd -P)" ] ||
  bad+=("Torch_DIR=$torch_dir")
nccl_dir=$(cache TALLY_NCCL_INCLUDE_DIR)
case "$nccl_dir" in ""|*NOTFOUND) bad+=("TALLY_NCCL_INCLUDE_DIR=${nccl_dir:-unset}") ;; esac
if [ ${#bad[@]} = 0 ]; then
  record "found where expected" ok 0 "absl, GTest, nlohmann_json, OpenSSL, Gloo under $PREFIX; Torch from the venv; nccl.h in $nccl_dir"
else
  record "found where expected" FAIL 0 "not from the carried prefix or venv: ${bad[*]}"
fi

# ---- build only what runs -----------------------------------------------
t0=$(date +%s)
l=$(left)
timeout --kill-after=10 $((l > 30 ? l - 20 : 10)) \
  cmake --build "$B" -j "$JOBS" --target "${TARGETS[@]}" -- -k 0 >"$OUT/build.log" 2>&1
rc=$?
# Built: ninja succeeded for all of them; or, after a failure, the target's
# file was written by this build or needed nothing (`ninja -n` alone would
# count a target whose source was edited while the build ran as broken).
built=() broken=()
for t in "${TARGETS[@]}"; do
  f=$B/$(ninja -C "$B" -t query "$t" 2>/dev/null | awk '/input: phony/ {getline; print $1; exit}')
  if [ "$rc" = 0 ] || { [ -f "$f" ] && [ "$(stat -c %Y "$f")" -ge "$t0" ]; } ||
     ninja -C "$B" -n "$t" 2>/dev/null | grep -q "no work to do"; then built+=("$t")
  else broken+=("$t"); fi
done
if [ ${#broken[@]} = 0 ]; then
  record build ok "$(elapsed "$t0")" "${#built[@]} targets, -j$JOBS (build.log)"
else
  grep -E -B2 -A12 "^FAILED:" "$OUT/build.log" | head -60
  record build FAIL "$(elapsed "$t0")" "not built: ${broken[*]} (ninja exited $rc; build.log)"
fi
is_built() { [[ " ${built[*]} " == *" $1 "* ]]; }
# Compile seconds from .ninja_log (a cold build's; ccache hits make it small):
# the sum, and the longest compile, bound a 16-core build from below.
awk 'NR > 1 {s += ($2 - $1) / 1000; if ($2 - $1 > m) {m = $2 - $1; n = $4}}
     END {printf "edge time %.0f s in all, longest %.0f s (%s)\n", s, m / 1000, n}' \
  "$B/.ninja_log" >"$OUT/build_times.txt" 2>/dev/null

# Every carried header was read from the prefix, never from /usr: on the GPU
# machine those system copies do not exist.
syshdr=$(ninja -C "$B" -t deps 2>/dev/null |
  grep -E '^ +/usr/(local/)?include/(x86_64-linux-gnu/)?(absl|gtest|gmock|nlohmann|openssl|gloo)/' |
  sort -u)
syslib=$(grep -oE '(^|[ :=])/usr/lib/x86_64-linux-gnu/lib(absl_[a-z0-9_]*|crypto|ssl|gtest[a-z_]*|gmock[a-z_]*)\.(so|a)[.0-9]*' \
  "$B/build.ninja" | sed 's/^[ :=]//' | sort -u)
if [ -z "$syshdr$syslib" ]; then
  record "no system -dev files" ok 0 "$(ninja -C "$B" -t deps 2>/dev/null | grep -c "^ *$PREFIX/") header reads from the prefix, none from /usr"
else
  printf '%s\n' "$syshdr" "$syslib" >"$OUT/system_files.txt"
  record "no system -dev files" FAIL 0 "$(echo "$syshdr$syslib" | wc -l) from /usr, e.g. $(echo "$syshdr" "$syslib" | head -1 | xargs) (system_files.txt)"
fi

# The kernels carry code for TALLY_CUDA_ARCHITECTURES (torch's cuda.cmake
# turns CMAKE_CUDA_ARCHITECTURES off). cuobjdump where the toolkit has it,
# else the architecture names nvcc writes into each object's fatbinary.
if [ -f "$B/kernels/libtally_kernels.a" ]; then
  lib=$B/kernels/libtally_kernels.a
  if [ -x "$(dirname "$NVCC")/cuobjdump" ]; then
    archs=$("$(dirname "$NVCC")/cuobjdump" --list-elf "$lib" 2>&1 | grep -oE 'sm_[0-9]+a?' | sort -u | xargs)
  else
    archs=$(strings -a "$lib" | grep -oE '\bsm_[0-9]+a?\b' | sort -u | xargs)
  fi
  want="sm_${TALLY_CUDA_ARCHITECTURES:-90}"
  want=${want%%-*}
  if [[ " $archs " == *" ${want%%;*} "* ]]; then
    record "kernels arch" ok 0 "libtally_kernels.a: $archs"
  else
    record "kernels arch" FAIL 0 "libtally_kernels.a has '${archs:-no ELF}', wanted ${want%%;*}"
  fi
fi

# ---- tests ------------------------------------------------------------------
run_test() {  # run_test NAME MIN MAX BINARY ARGS...
  local name=$1 min=$2 max=$3 bin=$4
  shift 4
  if ! is_built "$name"; then record "$name" FAIL 0 "not built"; return; fi
  step "$name" "$min" "$max" "$B/$bin" --gtest_output="xml:$OUT/$name.xml" "$@"
  [ "$STEP_RC" = 124 ] || [ "$STEP_RC" = 125 ] && return
  local summary
  summary=$(grep -hE '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ tests?' "$OUT/$name.log" |
    sed -E 's/^\[ +([A-Z]+) +\] ([0-9]+) tests?.*/\2 \L\1/' | paste -sd, - | sed 's/,/, /g')
  if [ "$STEP_RC" = 0 ]; then record "$name" ok "$STEP_S" "$summary"
  else record "$name" FAIL "$STEP_S" "exit $STEP_RC: $summary; $(grep -hE '^\[  FAILED  \] [A-Za-z]' "$OUT/$name.log" | awk '{print $4}' | sort -u | xargs)"; fi
}

run_test kernels_test 15 60 kernels/kernels_test
if [ "$REHEARSE" = 1 ]; then
  if is_built cuda_parity_test; then
    step cuda_parity_test 5 60 "$B/tests/gpu/cuda_parity_test" --gtest_list_tests
    n=$(grep -c '^  ' "$OUT/cuda_parity_test.log")
    if [ "$STEP_RC" = 0 ]; then record cuda_parity_test skip "$STEP_S" "skipped: no GPU (loads and lists $n tests)"
    else record cuda_parity_test FAIL "$STEP_S" "does not load (exit $STEP_RC; cuda_parity_test.log)"; fi
  else record cuda_parity_test FAIL 0 "not built"; fi
else
  run_test cuda_parity_test 45 200 tests/gpu/cuda_parity_test
fi

# ---- Tally's Hugging Face exports, loaded by transformers ----------------------
# build/hfcheck comes from tests/gpu/make-hf-check.sh (run where Tally is
# built; carry build/hfcheck). Skipped without it or without transformers.
HF_CHECK=$ROOT/build/hfcheck
if [ -f "$HF_CHECK/logits.json" ] &&
   timeout 60 "$PY" -c 'import transformers, sentencepiece' >/dev/null 2>&1; then
  step hf_transformers 20 120 "$PY" tests/gpu/hf_check.py "$HF_CHECK"
  if [ "$STEP_RC" = 0 ]; then
    record hf_transformers ok "$STEP_S" "$(grep -c '^ok' "$OUT/hf_transformers.log") checks (hf_transformers.log)"
  elif [ "$STEP_RC" != 124 ] && [ "$STEP_RC" != 125 ]; then
    record hf_transformers FAIL "$STEP_S" "$(grep -m1 '^FAIL' "$OUT/hf_transformers.log" | cut -c1-120 | sed 's/|/\//g')"
  fi
else
  record hf_transformers skip 0 "skipped: no build/hfcheck (tests/gpu/make-hf-check.sh) or no transformers in $PY"
fi

# ---- the numbers, for the README's GPU table ---------------------------------
write_results() {
{
  echo "# GPU run $(date -u +%FT%TZ)$([ "$REHEARSE" = 1 ] && echo ' (rehearsal: CPU, toy shapes)')"
  echo
  echo "${GPU:-no GPU}; card $CARD_LABEL ($CARD_HOW); nvcc $NVCC_VERSION; torch $TV; QUICK=$QUICK"
  echo
  sed 1,2d "$OUT/plan.md"
  echo; echo "## CUDA parity"; echo
  grep -hE "max diff|max \||CUDA training|NCCL|MoE layer|val loss after|sync check" "$OUT/cuda_parity_test.log" 2>/dev/null | sed 's/^/    /'
  echo; echo "## Hugging Face exports in transformers"; echo
  grep -hE "^(ok|FAIL) " "$OUT/hf_transformers.log" 2>/dev/null | sed 's/^/    /'
  for b in sync_audit step_bench step_bench_3b target_bench fp8_bench packing_bench grow_bench; do
    echo; echo "## $b"; echo
    grep -v '^==' "$OUT/$b.log" 2>/dev/null
  done
  echo; echo "## build"; echo
  cat "$OUT/build_times.txt" 2>/dev/null
} >"$OUT/results.md"
}

# ---- benchmarks -------------------------------------------------------------
# On the GPU: a ~1B-parameter model (20 x 2048) and a ~3B one (26 x 3072, d_ff
# 8192) for step time and MFU, each with the micro-batching plan_rows chose
# for the card; QUICK a ~100M one. The rehearsal runs each on the CPU at a toy
# shape with the card's flags, so a wrong flag or a crash shows before a GPU
# is spent on it. Stage budgets (min to start, max to run, seconds; the
# budget's cut comes first): the benchmarks in order of what the numbers
# table needs, so the ones skipped for time are the last.
PEAKS=(--peak_tflops="$PEAK_BF16" --peak_fp8_tflops="$PEAK_FP8")
if [ "$REHEARSE" = 1 ]; then
  DEV=cpu
  STEP_ARGS=(--layers=1 --d_model=64 --seq_len=128 --rows=2 --steps=3 --warmup_steps=1)
  STEP3B_ARGS=(--layers=1 --d_model=128 --seq_len=128 --rows=1 --micro_batches=2 --steps=3
    --warmup_steps=1)
  SYNC_ARGS=(--layers=1 --d_model=64 --seq_len=128 --rows=2 --steps=2)
  TARGET_ARGS=(--layers=1 --d_model=64 --seq_len=128 --rows=4 --naive_steps=6 --eval_every=2
    --eval_tokens=2048 --experts=4 --warmup_steps=1)
  PACK_ARGS=(--d_model=64 --layers=1 --seq_len=128 --rows=2 --steps=3 --warmup_steps=1)
  FP8_ARGS=(--tokens=64 --d_in=64 --d_out=64 --reps=1)
  GROW_ARGS=(--layers=2 --d_model=64 --seq_len=128 --rows=2 --steps=3 --warmup_steps=1
    --experts=4 --eval_tokens=2048)
elif [ "$QUICK" = 1 ]; then
  DEV=cuda:0
  STEP_ARGS=(--layers=8 --d_model=1024 --seq_len=2048 --rows=8 --steps=8 --warmup_steps=3)
  SYNC_ARGS=(--layers=2 --d_model=512 --seq_len=1024 --rows=2 --micro_batches=2 --steps=3)
  TARGET_ARGS=(--layers=6 --d_model=512 --seq_len=1024 --rows=16 --naive_steps=200
    --eval_every=10 --eval_tokens=32768)
else
  DEV=cuda:0
  STEP_ARGS=(--layers=20 --d_model=2048 --seq_len=2048 --rows="$ROWS_1B" --micro_batches="$MB_1B"
    --steps=15 --warmup_steps=5)
  STEP3B_ARGS=(--layers=26 --d_model=3072 --seq_len=2048 --rows="$ROWS_3B"
    --micro_batches="$MB_3B" --steps=10 --warmup_steps=4)
  SYNC_ARGS=(--layers=4 --d_model=1024 --seq_len=2048 --rows=2 --micro_batches=2 --steps=4)
  TARGET_ARGS=(--layers=12 --d_model=1024 --seq_len=1024 --rows=16 --naive_steps=400
    --eval_every=10 --eval_tokens=65536)
  PACK_ARGS=(--d_model=1024 --layers=8 --seq_len=2048 --rows=8 --steps=30 --warmup_steps=5)
  FP8_ARGS=(--tokens=8192 --d_in=4096 --d_out=4096 --reps=20)
  GROW_ARGS=(--layers=8 --d_model=1024 --seq_len=1024 --rows=8 --steps=12 --warmup_steps=3
    --experts=8 --eval_tokens=65536)
fi
bench() {  # bench NAME MIN MAX BINARY ARGS...
  local name=$1 min=$2 max=$3 bin=$4
  shift 4
  local target=${bin##*/}
  if ! is_built "$target"; then record "$name" FAIL 0 "not built"; return; fi
  step "$name" "$min" "$max" "$B/$bin" "$@"
  [ "$STEP_RC" = 124 ] || [ "$STEP_RC" = 125 ] && return
  if [ "$STEP_RC" = 0 ]; then record "$name" ok "$STEP_S" "--device=$DEV$([ "$REHEARSE" = 1 ] && echo ", toy shape") ($name.log)$(bench_note "$name")"
  else record "$name" FAIL "$STEP_S" "exit $STEP_RC: $(grep -v '^==' "$OUT/$name.log" | tail -1 | sed 's/|/\//g' | cut -c1-160)"; fi
}
bench_note() {  # the line of a benchmark's log the table shows
  case "$1" in
    step_bench*) grep -m1 '^FP8 / BF16' "$OUT/$1.log" | sed 's/^/; /' ;;
    target_bench) grep -m1 '^combined' "$OUT/$1.log" | cut -c1-100 | sed 's/^/; /' ;;
    grow_bench) grep -m1 '^upcycled / dense' "$OUT/$1.log" | sed 's/^/; /' ;;
    sync_audit) grep -m1 '^summary syncs' "$OUT/$1.log" | sed 's/^summary syncs/; syncs per step:/' ;;
  esac
}
if [ "$REHEARSE" = 1 ]; then
  # On the CPU the audit only proves it loads and takes its flags.
  if is_built sync_audit; then
    step sync_audit 5 60 "$B/tests/gpu/sync_audit" --device=cpu --train_path="$FORTUNES" \
      "${SYNC_ARGS[@]}"
    if [ "$STEP_RC" = 0 ]; then record sync_audit skip "$STEP_S" "skipped: no GPU (loads and takes its flags; the CPU has no syncs to count)"
    elif [ "$STEP_RC" != 124 ] && [ "$STEP_RC" != 125 ]; then record sync_audit FAIL "$STEP_S" "exit $STEP_RC (sync_audit.log)"; fi
  else record sync_audit FAIL 0 "not built"; fi
else
  bench sync_audit 15 60 tests/gpu/sync_audit --device=$DEV --train_path="$FORTUNES" "${SYNC_ARGS[@]}"
fi
bench step_bench 40 120 tests/gpu/step_bench --device=$DEV --train_path="$FORTUNES" "${PEAKS[@]}" \
  "${STEP_ARGS[@]}"
if [ "$QUICK" != 1 ]; then
  if [ "$ROWS_3B" -ge 1 ] || [ "$REHEARSE" = 1 ]; then
    bench step_bench_3b 40 120 tests/gpu/step_bench --device=$DEV --train_path="$FORTUNES" \
      "${PEAKS[@]}" "${STEP3B_ARGS[@]}"
  else
    record step_bench_3b skip 0 "skipped: memory (not one 2048-token row fits: $PLAN_3B)"
  fi
fi
bench target_bench 60 180 tests/gpu/target_bench --device=$DEV --train_path="$FORTUNES" \
  --usd_per_hour="$PRICE" --peak_tflops="$PEAK_BF16" "${TARGET_ARGS[@]}"
if [ "$QUICK" != 1 ]; then
  bench fp8_bench 15 60 bench/fp8_bench --device=$DEV "${FP8_ARGS[@]}"
  bench packing_bench 30 90 bench/packing_bench --device=$DEV --train_path="$FORTUNES" "${PACK_ARGS[@]}"
  bench grow_bench 30 90 tests/gpu/grow_bench --device=$DEV --train_path="$FORTUNES" "${GROW_ARGS[@]}"
fi

# ---- the numbers table ---------------------------------------------------------
# From the logs' "summary" lines (step_bench, sync_audit) and target_bench's
# table. In the rehearsal every number is marked skipped; what the CPU toy
# run's line parses to is shown beside it, proving the parsing, not a number.
state_of() {  # state_of NAME: "STATE: NOTE" of the step, or "not run"
  local i
  for i in "${!NAMES[@]}"; do
    [ "${NAMES[$i]}" = "$1" ] && { echo "${STATES[$i]}: ${NOTES[$i]}"; return; }
  done
  echo "not run"
}
kv() {  # kv LOG LINE_PREFIX KEY: KEY's value on the log's line starting LINE_PREFIX
  grep -m1 "^$2" "$OUT/$1.log" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$3=//p"
}
pct() { awk -v x="$1" 'BEGIN {printf "%.1f%%", 100 * x}'; }
step_numbers() {  # step_numbers LOG: BF16 and FP8 ms, MFU both ways, the ratio
  local log=$1
  local b_ms f_ms ratio
  b_ms=$(kv "$log" "summary BF16" ms)
  f_ms=$(kv "$log" "summary FP8" ms)
  ratio=$(kv "$log" "summary ratio" fp8_over_bf16)
  [ -z "$b_ms" ] && return
  printf 'BF16 %s ms, MFU %s PaLM / %s executed' "$b_ms" \
    "$(pct "$(kv "$log" "summary BF16" mfu)")" "$(pct "$(kv "$log" "summary BF16" mfu_executed)")"
  [ -z "$f_ms" ] && { echo; return; }
  printf '; FP8 %s ms, MFU %s / %s (%s / %s of the FP8 peak); **FP8/BF16 %s**\n' "$f_ms" \
    "$(pct "$(kv "$log" "summary FP8" mfu)")" "$(pct "$(kv "$log" "summary FP8" mfu_executed)")" \
    "$(pct "$(kv "$log" "summary FP8" mfu_fp8peak)")" \
    "$(pct "$(kv "$log" "summary FP8" mfu_executed_fp8peak)")" "$ratio"
}
sync_numbers() {
  local line
  line=$(grep -m1 '^summary syncs' "$OUT/sync_audit.log" 2>/dev/null | sed 's/^summary syncs *//')
  case "$line" in
    ""|skipped) return ;;
  esac
  echo "$line" | awk '{
    for (i = 1; i <= NF; i++) {
      split($i, kv, "="); n = kv[1]
      sub(/^moe_/, "MoE ", n); sub(/bf16/, "BF16", n); sub(/fp8/, "FP8", n)
      printf "%s%s %s", (i > 1 ? ", " : ""), n, kv[2]
    }
    print " (sync_audit.log lists each with its source line)"
  }'
}
dollar_numbers() {
  grep -E '^\| (naive|packed)' "$OUT/target_bench.log" 2>/dev/null |
    awk -F'|' '{gsub(/^ +| +$/, "", $2); gsub(/^ +| +$/, "", $7); gsub(/^ +| +$/, "", $8)
      printf "%s%s %s", (NR > 1 ? "; " : ""), $2,
        ($7 == "-" ? "not reached" : "$" $7 ($8 == "1.00x cheaper" ? "" : " (" $8 ")"))}
      END {if (NR) printf " at $%s/h\n", price}' price="$PRICE"
}
# number_of NAME STEP VALUE: the table's value for a number read from STEP's log.
number_of() {
  local name=$1 stepname=$2 value=$3 plan=${4:-}
  if [ "$REHEARSE" = 1 ]; then
    number "$name" "skipped: no GPU (rehearsal)${plan:+; plan: $plan}${value:+; from the CPU toy run, parsed: $value}"
  elif [ -n "$value" ]; then
    number "$name" "$value${plan:+ ($plan)}"
  else
    number "$name" "skipped: $(state_of "$stepname")"
  fi
}
numbers() {
  number "card" "$CARD_LABEL ($CARD_HOW), $MEM_MIB MiB; \$$PRICE/h (usd_per_gpu_hour.$PRICE_KEY); dense peaks $PEAK_BF16 BF16 / $PEAK_FP8 FP8 TFLOP/s"
  if [ "$QUICK" = 1 ]; then
    number_of "~100M step (8 x 1024, QUICK)" step_bench "$(step_numbers step_bench)"
  else
    number_of "1B step (20 x 2048)" step_bench "$(step_numbers step_bench)" \
      "$ROWS_1B rows x $MB_1B micro-batches of 2048 tokens"
    number_of "3B step (26 x 3072)" step_bench_3b "$(step_numbers step_bench_3b)" \
      "$ROWS_3B rows x $MB_3B micro-batches of 2048 tokens"
  fi
  number_of "host syncs per step" sync_audit "$(sync_numbers)"
  number_of "\$ to naive's loss" target_bench "$(dollar_numbers)"
  number "whole command" "$(( $(date +%s) - START )) s of the ${BUDGET_S} s budget"
}

write_results
numbers
finish "$FAILED"
