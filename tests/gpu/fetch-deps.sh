#!/usr/bin/env bash
# Run here, before tests/gpu/run.sh goes to a GPU machine that has LibTorch
# but no network and no Abseil, GoogleTest/GoogleMock, nlohmann-json, OpenSSL
# or Gloo headers: downloads those Debian packages into tests/gpu/.debs
# (ignored by git; carry it) and prepares the fortunes dataset the benchmarks
# read (build/demo/fortunes; carry it too). tests/gpu/run.sh's preflight
# refuses to start unless every package named in DEBS is carried.
set -euo pipefail
cd "$(dirname "$0")/../.."
# libgmock-dev: tally_add_test links GTest::gmock, and Debian's
# GTestConfig.cmake includes the gmock targets only when they are installed.
DEBS=(libabsl-dev libabsl20220623 libgtest-dev libgmock-dev nlohmann-json3-dev
  libssl-dev libssl3 libgloo-dev)
mkdir -p tests/gpu/.debs
(cd tests/gpu/.debs && rm -f ./*.deb && apt-get download "${DEBS[@]}")
printf '%s\n' "${DEBS[@]}" >tests/gpu/.debs/PACKAGES
B=${BUILD_DIR:-build}
[ -s "$B/demo/fortunes/train.idx" ] ||
  "$B/cli/tally-prep" --out="$B/demo/fortunes" /usr/share/games/fortunes/*.u8
# run.sh reads build/demo/fortunes, whatever BUILD_DIR made it.
if [ "$B" != build ] && [ ! -e build/demo/fortunes/train.idx ]; then
  mkdir -p build/demo && cp -r "$B/demo/fortunes" build/demo/
fi
# The transformers check (tests/gpu/hf_check.py) reads build/hfcheck: made
# where the tools are built (make build); carry it too.
if [ -x "$B/worker/tally-export" ] && [ -x "$B/worker/tally-forward" ] &&
   [ -x "$B/worker/tally-train" ]; then
  BUILD_DIR=$B tests/gpu/make-hf-check.sh >/dev/null
fi
du -sh tests/gpu/.debs build/demo/fortunes build/hfcheck 2>/dev/null
