# The two commands a newcomer needs (README): `make run` and `make test`.
# Both install what is missing (scripts/install-deps.sh), then build.
#
# Build caches live in a fixed path so CI and repeated runs reuse them:
#   $(OML_CACHE)/cargo-target   cargo's target directory (delta-rs is the slow part)
#   $(OML_CACHE)/ccache         compiler cache for the C++ build
#   $(OML_CACHE)/build          the CMake/ninja build tree
#   $(OML_CACHE)/venv           the Python test tools (tests/requirements.txt)
#   $(OML_CACHE)/ivy            the delta-spark jars Spark resolves from Maven (tests/test_lake_spark.py)
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

.PHONY: all deps deploy-tools build run test test-cpp test-py venv bench bench-lake bench-uploads bench-reconcile bench-soak clean format

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

# kustomize and the CloudNativePG / prometheus-operator CRD schemas for tests/test_deploy.py
# (pinned; built and fetched once into $(OML_CACHE), offline after that). They need Go (1.22+);
# without it (exit 3) the rendering checks of tests/test_deploy.py are skipped and say why.
deploy-tools:
	@OML_CACHE=$(OML_CACHE) scripts/install-deploy-tools.sh || [ $$? -eq 3 ]

bench-soak: build venv
	$(VENV)/bin/python bench/soak

CTEST = cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300
PYTEST = OML_BIN=$(OML) OML_CACHE=$(OML_CACHE) $(VENV)/bin/python -m pytest -q tests $(PYTEST_ARGS)

# C++ tests first, then Python (in sequence: both start PostgreSQL clusters on the same cores).
test: build venv deploy-tools
	$(CTEST)
	$(PYTEST)

test-cpp: build
	$(CTEST)

test-py: build venv deploy-tools
	$(PYTEST)

bench: build venv
	@scripts/install-deps.sh --bench
	OML_BIN=$(OML) bench/commit-point
	@echo "the lake writer's benchmarks (about 20 min at full size): make bench-lake"

# The lake writer (docs/performance.md "Lake"): backlog drain, steady-state lag, Delta commit
# latency (local disk and moto S3), and the commit point with the writer running beside it.
# BENCH_LAKE_ARGS picks sub-benchmarks and sizes, e.g. BENCH_LAKE_ARGS="drain --events 20000".
bench-lake: build venv
	@scripts/install-deps.sh --bench
	OML_BIN=$(OML) OML_VENV=$(VENV) $(VENV)/bin/python bench/lake $(BENCH_LAKE_ARGS)

# tus uploads and attachments (docs/performance.md "Uploads and attachments"): 1 GiB upload
# throughput against the openssl single-core bound, parallel uploads with the server's peak RSS,
# and a claim's attachments through submit, serve and accept. E.g. BENCH_UPLOADS_ARGS="--size 64MiB".
bench-uploads: build venv
	OML_BIN=$(OML) OML_VENV=$(VENV) $(VENV)/bin/python bench/uploads $(BENCH_UPLOADS_ARGS)

# `oml reconcile` (docs/performance.md "Reconcile"): a full audit of 1,000,000 events and 10,000
# objects against pyarrow + psycopg reading the same rows. E.g. BENCH_RECONCILE_ARGS="--events 20000 --objects 200".
bench-reconcile: build venv
	OML_BIN=$(OML) OML_VENV=$(VENV) $(VENV)/bin/python bench/reconcile $(BENCH_RECONCILE_ARGS)

clean:
	rm -rf $(BUILD)
