# tally-worker, tally-train and tally-prep. Two images from one file; build
# from the repository root (BuildKit builds only the stages a target needs):
#
#   docker build -f deploy/docker/worker.Dockerfile --target cpu \
#     -t tally/tally-worker:0.1.0-cpu .
#   docker build -f deploy/docker/worker.Dockerfile --target cuda \
#     -t tally/tally-worker:0.1.0-cuda13.0 .
#
# Neither image has been built: the machine these files were written on has
# the Docker client but no Docker daemon (nor podman or buildah). What was
# checked there is what the final stages contain: deploy/docker/stage-runtime.sh
# run on the same binaries and LibTorch (see "Size" below).
#
# Each build stage ends with deploy/docker/stage-runtime.sh, which stages the
# binaries plus exactly the shared libraries they load and lists the
# distribution packages for the rest; the final stage copies only that. The
# sources, build tree, LibTorch headers and CMake files, the unused LibTorch
# libraries (libtorch_cuda in the CPU image) and the kubectl/validation venv
# that scripts/setup.sh installs never reach an image. The stage prints its
# file list with sizes (/stage/files.txt) in the build log.
#
# Size (CPU image, files the final stage copies, measured with
# stage-runtime.sh on the same torch 2.11.0 wheel): 461,694,347 bytes
# (440 MiB), of which libtorch_cpu.so is 451 MB; plus debian:12-slim and the
# runtime packages (gRPC, protobuf, Abseil, spdlog, yaml-cpp, OpenSSL). The
# previous image copied all of /opt/tally: about 1,340 MB (LibTorch with
# libtorch_cuda.so and headers 1,041 MB, the CUDA runtime wheels 52 MB, the
# kubectl venv 166 MB, binaries with debug sections 82 MB).

# The CUDA stages. The build needs nvcc (the FP8 and MoE kernels), which
# debian:12 lacks, so it runs on NVIDIA's CUDA devel image; its Ubuntu 24.04
# has the same gRPC 1.51, protobuf 3.21 and Abseil 20220623 as Debian 12. The
# torch wheel brings its own CUDA user-space libraries (cuBLAS, cuDNN, NCCL),
# so the final stage is plain Ubuntu of the same release; the node's driver
# (libcuda) comes from the NVIDIA container runtime.
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.2-devel-ubuntu24.04
ARG CUDA_RUNTIME_BASE=ubuntu:24.04

FROM ${CUDA_DEVEL_IMAGE} AS build-cuda
ARG TORCH_VERSION=2.11.0
# Every GPU type the gpu overlay schedules on: A100 (8.0) and H100/H200 (9.0).
ARG CUDA_ARCHITECTURES="80;90"
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      build-essential cmake ninja-build pkg-config ca-certificates python3 python3-venv \
      protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libabsl-dev \
      libsqlite3-dev libcivetweb-dev libyaml-cpp-dev libspdlog-dev nlohmann-json3-dev \
      libssl-dev libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/tally/torch-venv \
 && /opt/tally/torch-venv/bin/pip install --quiet --no-cache-dir "torch==${TORCH_VERSION}"
WORKDIR /src
COPY . .
RUN site=$(/opt/tally/torch-venv/bin/python -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])') \
 && TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}" cmake -S . -B build -G Ninja \
      -DTALLY_TORCH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
      -DCMAKE_PREFIX_PATH="$site/torch/share/cmake" \
 && cmake --build build --target tally-worker tally-train tally-prep \
 && deploy/docker/stage-runtime.sh /stage --tree "$site/torch/lib" --tree "$site/nvidia" \
      build/worker/tally-worker build/worker/tally-train build/cli/tally-prep \
 && cat /stage/files.txt

FROM ${CUDA_RUNTIME_BASE} AS cuda
COPY --from=build-cuda /stage/packages.txt /tmp/packages.txt
RUN apt-get update -qq \
 && xargs -a /tmp/packages.txt env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/packages.txt \
 && useradd --uid 10001 --user-group --no-create-home tally
COPY --from=build-cuda /stage/root/ /
ENV NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/tally-worker"]

# The CPU stages: the same steps as `make` (scripts/setup.sh unpacks the
# pinned torch wheel's LibTorch; the golden losses are computed with it). A
# CPU worker links libtorch_cpu and c10 only, so libtorch_cuda stays behind;
# libtorch_cpu still names the CUDA runtime and CUPTI, which setup.sh
# unpacks beside LibTorch (4.9 MB).
FROM debian:12 AS build-cpu
WORKDIR /src
COPY . .
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends make sudo ca-certificates \
 && TALLY_CACHE_DIR=/opt/tally scripts/setup.sh \
 && cmake --build build --target tally-worker tally-train tally-prep \
 && deploy/docker/stage-runtime.sh /stage \
      build/worker/tally-worker build/worker/tally-train build/cli/tally-prep \
 && cat /stage/files.txt

FROM debian:12-slim AS cpu
COPY --from=build-cpu /stage/packages.txt /tmp/packages.txt
RUN apt-get update -qq \
 && xargs -a /tmp/packages.txt env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/packages.txt \
 && useradd --uid 10001 --user-group --no-create-home tally
COPY --from=build-cpu /stage/root/ /
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/tally-worker"]
