# The two commands a newcomer needs (README): `make run` and `make test`.
# Both install what is missing (scripts/install-deps.sh), then build.
#
# Build caches live in a fixed path so CI and repeated runs reuse them:
#   $(OML_CACHE)/cargo-target   cargo's target directory (delta-rs is the slow part)
#   $(OML_CACHE)/ccache         compiler cache for the C++ build
#   $(OML_CACHE)/build          the CMake/ninja build tree
#   $(OML_CACHE)/venv           the Python test tools (tests/requirements.txt)
OML_CACHE ?= $(HOME)/.cache/oml
BUILD ?= $(OML_CACHE)/build
VENV ?= $(OML_CACHE)/venv
export CARGO_TARGET_DIR ?= $(OML_CACHE)/cargo-target
export CCACHE_DIR ?= $(OML_CACHE)/ccache
# Paths under the checkout are hashed relative to it, so a clone elsewhere still hits the cache.
export CCACHE_BASEDIR ?= $(CURDIR)
export PATH := $(HOME)/.cargo/bin:$(PATH)
JOBS ?= $(shell nproc)
OML := $(BUILD)/oml

.PHONY: all deps build run test test-cpp test-py venv bench clean format

all: build

deps:
	@scripts/install-deps.sh

# A build tree configured from another checkout is reset (ccache keeps the rebuild cheap).
build: deps
	@mkdir -p $(BUILD)
	@if [ -f $(BUILD)/CMakeCache.txt ] && ! grep -q "CMAKE_HOME_DIRECTORY:INTERNAL=$(CURDIR)$$" $(BUILD)/CMakeCache.txt; then \
	  echo "build tree belongs to another checkout; reconfiguring"; rm -rf $(BUILD); mkdir -p $(BUILD); fi
	@[ -f $(BUILD)/build.ninja ] || cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(OML) dev

venv: $(VENV)/.installed
$(VENV)/.installed: tests/requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r tests/requirements.txt
	touch $@

CTEST = cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300
PYTEST = OML_BIN=$(OML) $(VENV)/bin/python -m pytest -q tests $(PYTEST_ARGS)

# C++ tests first, then Python (in sequence: both start PostgreSQL clusters on the same cores).
test: build venv
	$(CTEST)
	$(PYTEST)

test-cpp: build
	$(CTEST)

test-py: build venv
	$(PYTEST)

bench: build venv
	@scripts/install-deps.sh --bench
	OML_BIN=$(OML) bench/commit-point

clean:
	rm -rf $(BUILD)
