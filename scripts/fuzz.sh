#!/usr/bin/env bash
# libFuzzer targets (fuzz/): builds them in a clang configuration of their own
# and runs them.
#
#   scripts/fuzz.sh build          configure FUZZ_BUILD_DIR if needed; build the targets
#   scripts/fuzz.sh run [SECONDS]  replay fuzz/regressions, then fuzz each target
#                                  SECONDS (FUZZ_SECONDS, default 60)
#   scripts/fuzz.sh ci [SECONDS]   the same, 15 s by default, after an incremental
#                                  build; for `make test` (ctest entry fuzz.ci)
#
# A run starts from fuzz/corpus/<target> and fuzz/regressions/<target>
# (read only) and keeps what it finds in FUZZ_BUILD_DIR/corpus/<target>, so
# the tree is never modified. A crash, leak, hang or out-of-memory input is
# saved under FUZZ_BUILD_DIR/artifacts/<target>/; add it to
# fuzz/regressions/<target>/ once understood, so every CI run replays it.
# FUZZ_TARGETS="a b" picks targets. Exit status: 0 when nothing was found.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

FUZZ_BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
case "$FUZZ_BUILD_DIR" in /*) ;; *) FUZZ_BUILD_DIR=$ROOT/$FUZZ_BUILD_DIR ;; esac
CACHE_DIR=${TALLY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tally}
LIBTORCH_DIR=${LIBTORCH_DIR:-$CACHE_DIR/libtorch-2.11.0/torch}
ALL_TARGETS="spec_fuzz experiment_fuzz corpus_fuzz dataset_fuzz checkpoint_fuzz scheduler_fuzz
             auth_tokens_fuzz jwt_fuzz controller_list_fuzz safetensors_fuzz"
TARGETS=${FUZZ_TARGETS:-$ALL_TARGETS}
SANITIZE="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
JOBS=${JOBS:-$(nproc)}
SKIP=""

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

configured() { [ -f "$FUZZ_BUILD_DIR/build.ninja" ]; }

build() {
  if ! configured; then
    for tool in clang clang++; do
      command -v "$tool" >/dev/null ||
        { echo "fuzz: $tool not found: run scripts/setup.sh (make setup)" >&2; exit 1; }
    done
    echo "fuzz: configuring $FUZZ_BUILD_DIR (clang, $SANITIZE)"
    cmake -S "$ROOT" -B "$FUZZ_BUILD_DIR" -G Ninja \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_FLAGS="$SANITIZE" -DCMAKE_CXX_FLAGS="$SANITIZE" \
      -DTALLY_LIBTORCH_DIR="$LIBTORCH_DIR" -DTALLY_FUZZ=ON >/dev/null
  fi
  local start=$SECONDS
  cmake --build "$FUZZ_BUILD_DIR" --target $TARGETS -j "$JOBS"
  echo "fuzz: targets built in $((SECONDS - start)) s"
}

# The sanitizers' settings. Leak detection stays on for every target:
# LibTorch (prebuilt, not instrumented) reports no leak from its start-up.
# FUZZ_ASAN_OPTIONS adds to them (e.g. detect_leaks=0).
sanitizer_env() {
  export ASAN_OPTIONS="detect_leaks=1:handle_abort=1:allocator_may_return_null=0${FUZZ_ASAN_OPTIONS:+:$FUZZ_ASAN_OPTIONS}"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
}

# The flags every run shares: a 10 s per-input limit catches hangs, 2 GiB
# catches runaway allocations, and -max_len covers a small dataset or
# checkpoint.
FUZZ_FLAGS=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=16384
            -print_final_stats=1)

replay() {  # replay TARGET: each regression input once
  local t=$1 bin=$FUZZ_BUILD_DIR/fuzz/$1 dir=$ROOT/fuzz/regressions/$1
  local inputs=()
  [ -d "$dir" ] && mapfile -t inputs < <(find "$dir" -type f ! -name '*.md' | sort)
  if [ ${#inputs[@]} -eq 0 ]; then
    printf '%-16s %4d inputs  ok\n' "$t" 0
    return 0
  fi
  local log=$WORK/$t.replay.log
  sanitizer_env
  if (cd "$WORK" && "$bin" "${FUZZ_FLAGS[@]}" "${inputs[@]}") >"$log" 2>&1; then
    printf '%-16s %4d inputs  ok\n' "$t" "${#inputs[@]}"
  else
    printf '%-16s %4d inputs  FAILED (log: %s)\n' "$t" "${#inputs[@]}" "$log"
    grep -m1 -B2 -A25 -E 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error|invariant violated|terminate called' "$log" || tail -30 "$log"
    return 1
  fi
}

fuzz_one() {  # fuzz_one TARGET SECONDS -> one summary row in $WORK/summary
  local t=$1 seconds=$2 bin=$FUZZ_BUILD_DIR/fuzz/$1
  local corpus=$FUZZ_BUILD_DIR/corpus/$t art=$WORK/artifacts/$t/ log=$WORK/$t.log
  mkdir -p "$corpus" "$art"
  local seeds=()
  for d in "$ROOT/fuzz/corpus/$t" "$ROOT/fuzz/regressions/$t"; do [ -d "$d" ] && seeds+=("$d"); done
  local dict=()
  [ -f "$ROOT/fuzz/$t.dict" ] && dict=(-dict="$ROOT/fuzz/$t.dict")
  sanitizer_env
  local rc=0
  (cd "$WORK" && "$bin" "${FUZZ_FLAGS[@]}" "${dict[@]}" -max_total_time="$seconds" \
      -artifact_prefix="$art" "$corpus" "${seeds[@]}") >"$log" 2>&1 || rc=$?
  local runs eps cov corp
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  corp=$(grep -oE 'corp: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
  local result=ok
  local found=()
  mapfile -t found < <(find "$art" -type f | sort)
  if [ "$rc" -ne 0 ] || [ ${#found[@]} -gt 0 ]; then
    result="FAILED rc=$rc"
    local keep=$FUZZ_BUILD_DIR/artifacts/$t
    mkdir -p "$keep"
    for f in "${found[@]}"; do cp "$f" "$keep/"; result="$result $(basename "$f")"; done
    echo "---- $t: log $log; inputs kept in $keep" >&2
    grep -m1 -B2 -A25 -E 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error|invariant violated|terminate called' "$log" >&2 || tail -30 "$log" >&2
  fi
  printf '%-16s %6s %10s %9s %6s %6s  %s\n' "$t" "$seconds" "${runs:--}" "${eps:--}" \
    "${cov:--}" "${corp:--}" "$result" >>"$WORK/summary"
  [ "$result" = ok ]
}

fuzz_all() {  # fuzz_all SECONDS
  local seconds=$1 failed=0
  printf '%-16s %6s %10s %9s %6s %6s  %s\n' target secs runs exec/s cov corpus result \
    >"$WORK/summary"
  for t in $TARGETS; do
    if [[ " $SKIP " == *" $t "* ]]; then
      printf '%-16s %6s %10s %9s %6s %6s  %s\n' "$t" - - - - - \
        "FAILED: a regression input fails (above)" >>"$WORK/summary"
      failed=1
      continue
    fi
    echo "fuzz: $t for $seconds s"
    fuzz_one "$t" "$seconds" || failed=1
  done
  echo
  cat "$WORK/summary"
  return $failed
}

# Replays every target's regression inputs. A target whose regression input
# still fails is then not fuzzed (SKIP): it would only find that input again.
replay_all() {
  local failed=0
  echo "fuzz: replaying fuzz/regressions"
  for t in $TARGETS; do replay "$t" || { failed=1; SKIP="$SKIP $t"; }; done
  return $failed
}

check_built() {
  for t in $TARGETS; do
    if [ ! -x "$FUZZ_BUILD_DIR/fuzz/$t" ]; then
      echo "fuzz: $FUZZ_BUILD_DIR/fuzz/$t is not built: run scripts/fuzz.sh build" >&2
      return 1
    fi
  done
}

cmd=${1:-}
[ -n "$cmd" ] || usage
shift
mkdir -p "$FUZZ_BUILD_DIR"
WORK=$(mktemp -d "$FUZZ_BUILD_DIR/run.XXXXXX")
# The files the targets write for the code under test (fuzz/scratch_dir.h):
# on tmpfs where there is one, removed however the script ends.
SCRATCH=$(mktemp -d /dev/shm/tally-fuzz.XXXXXX 2>/dev/null || mktemp -d "$WORK/scratch.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
export TALLY_FUZZ_TMPDIR=$SCRATCH
case "$cmd" in
  build)
    rmdir "$WORK"
    build
    ;;
  run)
    check_built
    start=$SECONDS
    rc=0
    replay_all || rc=1
    fuzz_all "${1:-${FUZZ_SECONDS:-60}}" || rc=1
    echo "fuzz: $((SECONDS - start)) s in all; logs in $WORK"
    exit $rc
    ;;
  ci)
    # Skipped (77, ctest's SKIP_RETURN_CODE) where the clang configuration
    # was never made: `make test` makes it.
    if ! configured; then
      echo "fuzz: $FUZZ_BUILD_DIR is not configured (make fuzz-build); skipping" >&2
      rmdir "$WORK"
      exit 77
    fi
    if ! build >"$WORK/build.log" 2>&1; then
      cat "$WORK/build.log" >&2
      exit 1
    fi
    start=$SECONDS
    rc=0
    replay_all || rc=1
    fuzz_all "${1:-${FUZZ_SECONDS:-15}}" || rc=1
    echo "fuzz: $((SECONDS - start)) s in all; logs in $WORK"
    [ $rc -eq 0 ] && rm -rf "$WORK"
    exit $rc
    ;;
  *) usage ;;
esac
