# tally-worker with LibTorch, on the same Debian as the build. The build
# stage runs the same steps as `make` (scripts/setup.sh unpacks the pinned
# torch wheel's LibTorch). With --build-arg TORCH_CUDA=1 it instead installs
# the CUDA torch wheel (which brings NVIDIA's CUDA 13 user-space libraries,
# cuBLAS and cuDNN as wheels) and builds with -DTALLY_TORCH_CUDA=ON; the GPU
# node's driver (libcuda) comes from the NVIDIA container runtime. Build from
# the repository root:
#   docker build -f deploy/docker/worker.Dockerfile -t tally/tally-worker:0.1.0-cpu .
#   docker build -f deploy/docker/worker.Dockerfile --build-arg TORCH_CUDA=1 \
#     -t tally/tally-worker:0.1.0-cuda13.0 .
FROM debian:12 AS build
ARG TORCH_CUDA=0
WORKDIR /src
COPY . .
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends make sudo ca-certificates \
 && TALLY_CACHE_DIR=/opt/tally scripts/setup.sh \
 && if [ "$TORCH_CUDA" = 1 ]; then \
      /usr/bin/python3 -m venv /opt/tally/torch-venv \
      && /opt/tally/torch-venv/bin/pip install --quiet torch==2.11.0 \
      && cmake -S . -B build -DTALLY_TORCH_CUDA=ON \
           -DCMAKE_PREFIX_PATH="$(/opt/tally/torch-venv/bin/python -c 'import torch;print(torch.utils.cmake_prefix_path)')"; \
    fi \
 && cmake --build build --target tally-worker tally-train tally-prep \
 && mkdir -p /opt/tally/torch-venv

FROM debian:12-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libyaml-cpp0.7 libspdlog1.10 libfmt9 \
      libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 10001 --user-group --no-create-home tally
# LibTorch (and, for CUDA, the torch wheel's NVIDIA libraries) at the paths
# the binaries' RPATH names.
COPY --from=build /opt/tally /opt/tally
COPY --from=build /src/build/worker/tally-worker /src/build/worker/tally-train \
     /src/build/cli/tally-prep /usr/local/bin/
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/tally-worker"]
