# The two commands of the README: `make demo` and `make test`. Each runs the
# idempotent set-up (Debian packages, pinned LibTorch, configure) and builds.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
export BUILD_DIR

.PHONY: setup build test unit integration demo bench clean

setup:
	@scripts/setup.sh

build: setup
	@cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 600

unit: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -L unit

integration: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -L integration

demo: build
	@scripts/demo.sh

bench: build
	@scripts/bench.sh

clean:
	rm -rf $(BUILD_DIR)
