# chunkfuse: `make demo` and `make test` each set up everything on a fresh machine.
#
# One cargo profile (release) serves the CLI, `cargo test` and `maturin develop`, so the
# workspace compiles once.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ZARR2_VENV := .venv-zarr2
CARGO ?= cargo
BIN := target/release/chunkfuse
export CHUNKFUSE_BIN := $(CURDIR)/$(BIN)
export CHUNKFUSE_ZARR2_PYTHON := $(CURDIR)/$(ZARR2_VENV)/bin/python

.PHONY: all build develop venv graphviz test test-rust test-python test-cubed test-dask lint fmt demo bench clean wheel wheel-smoke fuzz fuzz-asan reliability

all: develop

$(VENV)/.installed: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# zarr-python 2 writes the Zarr v2 fixtures of the interop tests (it cannot share a
# virtual environment with zarr-python 3).
$(ZARR2_VENV)/.installed:
	$(PYTHON) -m venv $(ZARR2_VENV)
	$(ZARR2_VENV)/bin/pip install --quiet --upgrade pip
	$(ZARR2_VENV)/bin/pip install --quiet "zarr>=2.18,<3" "numpy>=1.26,<2.3"
	touch $@

venv: $(VENV)/.installed $(ZARR2_VENV)/.installed

build:
	$(CARGO) build --release --workspace

develop: venv build
	VIRTUAL_ENV=$(CURDIR)/$(VENV) PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/maturin develop --release --quiet

test-rust: build
	$(CARGO) test --release -p chunkfuse-engine

# The fuzz harness (engine/tests/fuzz.rs) for 10 minutes per target, each target's runs,
# corpus size and failures appended to bench/fuzz.jsonl (`make test` runs it 10 s per target).
FUZZ_SECONDS ?= 600
fuzz: build
	CHUNKFUSE_FUZZ_SECONDS=$(FUZZ_SECONDS) CHUNKFUSE_FUZZ_REPORT=$(CURDIR)/bench/fuzz.jsonl \
		$(CARGO) test --release -p chunkfuse-engine --test fuzz -- --nocapture

# The fuzz harness and the engine's unit tests under AddressSanitizer (reads past a buffer in
# `unsafe` code abort the run): needs a nightly toolchain (`rustup toolchain install nightly`),
# builds into target/asan, appends the fuzz lines to bench/fuzz-asan.jsonl. Not part of `make
# test` (CI installs no nightly).
ASAN_FUZZ_SECONDS ?= 300
ASAN = RUSTFLAGS="-Zsanitizer=address" CARGO_TARGET_DIR=$(CURDIR)/target/asan
fuzz-asan:
	$(ASAN) $(CARGO) +nightly test --release --target x86_64-unknown-linux-gnu \
		-p chunkfuse-engine --lib
	$(ASAN) CHUNKFUSE_FUZZ_SECONDS=$(ASAN_FUZZ_SECONDS) \
		CHUNKFUSE_FUZZ_REPORT=$(CURDIR)/bench/fuzz-asan.jsonl \
		$(CARGO) +nightly test --release --target x86_64-unknown-linux-gnu \
		-p chunkfuse-engine --test fuzz -- --nocapture

# The reliability harnesses of docs/reliability.md, each appending its lines to bench/ and the
# tables rendered into the page: SIGKILLs of every entry point that writes (20 seeds each),
# peak RSS of every op kind at ten times the budget, and the storage faults matrix (`make test`
# runs the faults and 2 kill seeds per entry point, without recording them).
KILL_SEEDS ?= 20
reliability: develop
	$(PY) scripts/kill_harness.py --seeds $(KILL_SEEDS) --out bench/kill.jsonl
	$(PY) scripts/memory_table.py --out bench/memory.jsonl
	CHUNKFUSE_FAULTS_REPORT=$(CURDIR)/bench/faults.jsonl \
		CHUNKFUSE_FAULTS_STAMP="$$($(PY) scripts/run_record.py)" \
		$(PY) -m pytest -q -p no:logging tests/test_faults.py
	$(PY) scripts/reliability_report.py

test-python: develop
	$(PY) -m pytest -q

lint: develop
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --all-targets --workspace -- -D warnings
	$(VENV)/bin/ruff check python tests scripts bench examples
	$(VENV)/bin/ruff format --check python tests scripts bench examples
	$(PY) scripts/check_layout.py
	$(PY) -m mypy python/chunkfuse
	$(PY) -m mypy.stubtest chunkfuse._engine

# Cubed's visualize tests need graphviz's `dot` (a Debian package).
graphviz:
	@command -v dot >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; \
	  else echo "graphviz is missing (apt-get install graphviz): Cubed's visualize tests will fail"; fi; }

# Cubed's and cubed-xarray's own test suites, with RustExecutor as every executor. They run in
# a scratch directory because some of their tests write files into the current one.
# The virtual environment comes first on PATH: Cubed's Lithops tests start Lithops' localhost
# workers with the `python` they find there.
CUBED_SUITE := PATH=$(CURDIR)/$(VENV)/bin:$$PATH PYTHONPATH=$(CURDIR)/tests/cubed_suite \
	$(CURDIR)/$(PY) -m pytest \
	-p cubed_rust_plugin -q -p no:cacheprovider -o tmp_path_retention_policy=failed
test-cubed: develop graphviz
	cd "$$(mktemp -d)" && $(CUBED_SUITE) --pyargs cubed.tests -W error::UserWarning
	cd "$$(mktemp -d)" && $(CUBED_SUITE) --pyargs cubed_xarray.tests

# Dask's own array tests, with chunkfuse.dask.get as every scheduler they name.
DASK_SUITE := PYTHONPATH=$(CURDIR)/tests/dask_suite $(CURDIR)/$(PY) -m pytest \
	-c $(CURDIR)/tests/dask_suite/pytest.ini -p dask_chunkfuse_plugin -p no:cacheprovider -q -rfE \
	-o tmp_path_retention_policy=failed
DASK_MODULES := test_array_core test_reductions test_rechunk test_fft test_ufunc test_routines \
	test_slicing
test-dask: develop
	cd "$$(mktemp -d)" && $(DASK_SUITE) --pyargs $(addprefix dask.array.tests.,$(DASK_MODULES))

test: develop test-rust test-python test-cubed test-dask

# An abi3 wheel, installed into a fresh virtual environment outside the checkout with no Rust
# toolchain on PATH, imported and used there (scripts/wheel_smoke.py).
WHEEL_DIR := target/wheels
SMOKE_VENV := target/wheel-smoke-venv
wheel: venv
	rm -rf $(WHEEL_DIR)
	$(VENV)/bin/maturin build --release --quiet --out $(WHEEL_DIR)
wheel-smoke: wheel
	rm -rf $(SMOKE_VENV)
	$(PYTHON) -m venv $(SMOKE_VENV)
	$(SMOKE_VENV)/bin/pip install --quiet $(WHEEL_DIR)/chunkfuse-*.whl "zarr>=3.1.3"
	cd "$$(mktemp -d)" && env -i HOME="$$HOME" PATH=/usr/bin:/bin \
	  $(CURDIR)/$(SMOKE_VENV)/bin/python $(CURDIR)/scripts/wheel_smoke.py

demo: develop
	$(PY) scripts/demo.py

bench: develop
	$(PY) -m pip install --quiet matplotlib tensorstore zarrs obstore
	$(PY) bench/run.py

fmt:
	$(CARGO) fmt --all

clean:
	rm -rf target $(VENV) $(ZARR2_VENV) .demo
