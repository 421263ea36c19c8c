# Tide: the two set-up commands are `make up` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# What `make test` runs a second time on the pure-Python path (TIDE_NO_EXTENSIONS=1):
# the layouts, the Tail's scan and the engines, where the compiled core is used.
PURE_PYTHON_TESTS := tests/format tests/tail tests/services/dispatch/engine \
	tests/services/storage/engine

.PHONY: up test lint typecheck protos check-protos venv clean bench

$(STAMP): pyproject.toml setup.py tide/format/_ccore.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## Start a local cluster on 127.0.0.1 with an embedded store under ./.tide (Ctrl-C stops it).
up: $(STAMP)
	$(VENV)/bin/tide up --store-dir ./.tide

## Lint, type-check and run the whole test suite.
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q
	@# The pure-Python twins of the compiled core (docs/performance.md), a second time.
	TIDE_NO_EXTENSIONS=1 $(PY) -m pytest -q -rfE $(PURE_PYTHON_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

## Regenerate the committed gRPC/protobuf code under tide/v1 from protos/.
protos: $(STAMP)
	$(PY) -m tide._protogen tide/v1

## The benchmarks of docs/benchmarks.md (several minutes; run on a quiet machine).
bench: $(STAMP)
	$(PY) -m bench.storage_append
	$(PY) -m bench.dispatch_apply --records 200000
	$(PY) -m bench.dispatch_replay --records 500000
	$(PY) -m bench.recovery_scan --mib 64
	$(PY) -m bench.gateway_produce_pull
	$(PY) -m bench.hop_ceiling

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
