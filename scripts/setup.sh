#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: Debian packages, the pinned
# LibTorch (unpacked from the official torch wheel into a cache outside the
# checkout, keyed by version), and a configured build tree. With everything
# present it takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0   # matches the GPU machine's torch (CUDA 13.0 build)
CACHE_DIR=${TALLY_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tally}
LIBTORCH_DIR=$CACHE_DIR/libtorch-$TORCH_VERSION
BUILD_DIR=${BUILD_DIR:-build}

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev libsqlite3-dev sqlite3 libcivetweb-dev libyaml-cpp-dev
  libspdlog-dev nlohmann-json3-dev libssl-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-grpcio python3-protobuf python3-yaml
  prometheus fortunes fortunes-min unzip curl
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -f "$LIBTORCH_DIR/.complete" ]; then
  echo "setup: fetching torch==$TORCH_VERSION wheel for LibTorch into $LIBTORCH_DIR"
  PY=""
  for cand in python3 /usr/bin/python3; do
    if "$cand" -m pip --version >/dev/null 2>&1; then PY=$cand; break; fi
  done
  if [ -z "$PY" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip
    PY=/usr/bin/python3
  fi
  mkdir -p "$CACHE_DIR"
  tmp=$(mktemp -d "$CACHE_DIR/download.XXXXXX")
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux_2_28_x86_64 \
    "torch==$TORCH_VERSION" -d "$tmp"
  rm -rf "$LIBTORCH_DIR.partial" && mkdir -p "$LIBTORCH_DIR.partial"
  # Only what a C++ program needs: headers, shared libraries, CMake files.
  unzip -q "$tmp"/torch-*.whl 'torch/include/*' 'torch/lib/*' 'torch/share/cmake/*' \
    -d "$LIBTORCH_DIR.partial"
  echo "$TORCH_VERSION" > "$LIBTORCH_DIR.partial/.complete"
  rm -rf "$tmp" "$LIBTORCH_DIR"
  mv "$LIBTORCH_DIR.partial" "$LIBTORCH_DIR"
fi

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja \
    -DTALLY_LIBTORCH_DIR="$LIBTORCH_DIR/torch" >/dev/null
fi
