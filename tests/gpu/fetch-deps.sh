#!/usr/bin/env bash
# Run here, before tests/gpu/run.sh goes to a GPU machine that has LibTorch
# but no network and no Abseil, GoogleTest, nlohmann-json or OpenSSL headers:
# downloads those Debian packages into tests/gpu/.debs (ignored by git; carry
# it) and prepares the fortunes dataset the benchmark reads (build/demo/fortunes).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p tests/gpu/.debs
(cd tests/gpu/.debs && apt-get download libabsl-dev libabsl20220623 libgtest-dev \
  nlohmann-json3-dev libssl-dev libssl3 libgloo-dev)
B=${BUILD_DIR:-build}
[ -s "$B/demo/fortunes/train.idx" ] ||
  "$B/cli/tally-prep" --out="$B/demo/fortunes" /usr/share/games/fortunes/*.u8
du -sh tests/gpu/.debs "$B/demo/fortunes"
