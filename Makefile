# Tide: the two set-up commands are `make up` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# What `make test` runs a second time on the pure-Python path (TIDE_NO_EXTENSIONS=1):
# the layouts, the Tail's scan, the engines and the client's decoding of pulled records,
# where the compiled core is used.
PURE_PYTHON_TESTS := tests/format tests/tail tests/services/dispatch/engine \
	tests/services/storage/engine tests/client/test_records.py

# The official RocketMQ 5 Python client, in a virtual environment of its own: its
# generated protobuf code registers apache.rocketmq.v2 as ours does, so the two never
# share a process. The tests and examples/rocketmq5 run it as a subprocess (docs/rocketmq5.md).
RMQ5_VENV  := .venv-rmq5
RMQ5_STAMP := $(RMQ5_VENV)/.installed
RMQ5_CLIENT := rocketmq-python-client==5.1.2

# make test runs pytest on this many pytest-xdist workers (most tests wait on service
# processes, so two keep both cores busy), a test module or a directory sharing a costly
# fixture per worker at a time, the longest first (tests/_xdist.py). PYTEST_WORKERS=0: serially.
PYTEST_WORKERS ?= 2
XDIST := -n $(PYTEST_WORKERS) --dist loadgroup

.PHONY: up test chromium lint typecheck protos check-protos venv rmq5-venv clean bench

$(STAMP): pyproject.toml setup.py tide/format/_ccore.c tide/format/_crc32.h
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

$(RMQ5_STAMP): Makefile
	$(PYTHON) -m venv $(RMQ5_VENV)
	$(RMQ5_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(RMQ5_VENV)/bin/python -m pip install --quiet '$(RMQ5_CLIENT)'
	touch $(RMQ5_STAMP)

rmq5-venv: $(RMQ5_STAMP)

## Start a local cluster on 127.0.0.1 with an embedded store under ./.tide (Ctrl-C stops it).
up: $(STAMP) $(RMQ5_STAMP)
	$(VENV)/bin/tide up --store-dir ./.tide

# The console's browser tests (tests/services/console) drive Debian's Chromium through
# playwright (the dev extra); CI runs as root, so apt-get can install it when missing.
CHROMIUM := /usr/bin/chromium

chromium:
	@test -x $(CHROMIUM) || { apt-get update -q && apt-get install -y -q --no-install-recommends chromium; }

## Lint, type-check and run the whole test suite.
test: $(STAMP) $(RMQ5_STAMP) chromium
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	@# The 30 slowest tests are printed at the end: the suite's 20-minute budget is watched from them.
	$(PY) -m pytest -q --durations=30 $(XDIST)
	@# The pure-Python twins of the compiled core (docs/performance.md), a second time.
	TIDE_NO_EXTENSIONS=1 $(PY) -m pytest -q -rfE $(XDIST) $(PURE_PYTHON_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## Regenerate the committed gRPC/protobuf code under tide/v1 from protos/.
protos: $(STAMP)
	$(PY) -m tide._protogen tide/v1
	$(PY) -m tide._protogen tide/rocketmq_v2 apache/rocketmq/v2

## The benchmarks of docs/benchmarks.md (several minutes; run on a quiet machine).
bench: $(STAMP)
	$(PY) -m bench.storage_append
	$(PY) -m bench.dispatch_apply --records 200000
	$(PY) -m bench.dispatch_replay --records 500000
	$(PY) -m bench.recovery_scan --mib 64
	$(PY) -m bench.gateway_produce_pull
	$(PY) -m bench.hop_ceiling

clean:
	rm -rf $(VENV) $(RMQ5_VENV) .mypy_cache .ruff_cache .pytest_cache
