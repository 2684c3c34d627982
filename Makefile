# The two commands of the README: `make demo` and `make test`. Each runs the
# idempotent set-up (Debian packages, pinned LibTorch, configure) and builds.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
# The libFuzzer targets' clang build (scripts/fuzz.sh) and how long `make
# fuzz` runs each target.
FUZZ_BUILD_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
export BUILD_DIR FUZZ_BUILD_DIR

.PHONY: setup build test unit integration demo bench clean fuzz fuzz-build gpu-rehearsal

setup:
	@scripts/setup.sh

build: setup
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# `make test` also builds the fuzz targets: ctest's fuzz.ci entry runs them
# briefly and replays fuzz/regressions.
test: build fuzz-build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

unit: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -L unit

integration: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L integration

demo: build
	@scripts/demo.sh

bench: build
	@scripts/bench.sh

fuzz-build: setup
	@JOBS=$(JOBS) scripts/fuzz.sh build

# Fuzzes each target FUZZ_SECONDS and prints a summary table.
fuzz: fuzz-build
	@scripts/fuzz.sh run $(FUZZ_SECONDS)

# tests/gpu/run.sh's preflight, configure and build on this machine (nvcc,
# no GPU): a fresh venv with torch==2.11.0 and only the carried Debian
# packages (tests/gpu/fetch-deps.sh), never the system's -dev packages. Once
# per card the lent machine may be (--card: the H100's and the H200's
# sizing, pricing and peaks; the second run keeps the first's venv and
# build). GPU steps skip; the tables land in
# $(GPU_REHEARSAL_OUT)/{h100,h200}/summary.md.
GPU_REHEARSAL_OUT ?= $(BUILD_DIR)/gpu-rehearsal
gpu-rehearsal: setup
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target tally-prep
	@tests/gpu/fetch-deps.sh
	@rm -rf $(GPU_REHEARSAL_OUT)
	@OUT=$(GPU_REHEARSAL_OUT)/h100 JOBS=$(JOBS) tests/gpu/run.sh --rehearse --card=h100
	@OUT=$(GPU_REHEARSAL_OUT)/h200 JOBS=$(JOBS) TALLY_REHEARSAL_VENV=keep \
	  tests/gpu/run.sh --rehearse --card=h200

clean:
	rm -rf $(BUILD_DIR) $(FUZZ_BUILD_DIR) build-gpu-rehearsal
