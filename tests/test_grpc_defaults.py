"""Tide's processes choose gRPC's I/O path before gRPC is imported (tide/grpc_defaults.py):
each entry point sets GRPC_EXPERIMENTS unless the operator did, in a real interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tide.grpc_defaults import (
    GRPC_EXPERIMENTS_ENV,
    TIDE_GRPC_EXPERIMENTS,
    use_tide_grpc_defaults,
)

# Importing each runs what the process runs before its main (the services' __main__
# modules call main only as __main__).
ENTRY_MODULES = [
    "services.gateway.__main__",
    "services.storage.__main__",
    "services.dispatch.__main__",
    "services.nameserver.__main__",
    "services.console.__main__",
    "tide.cli",
    "bench",
]
PROBE = """
import importlib, os, sys
importlib.import_module(sys.argv[1])
import grpc  # the process's gRPC, as its entry point left it
print(repr(os.environ.get("GRPC_EXPERIMENTS")))
"""


def run_entry(module: str, experiments: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != GRPC_EXPERIMENTS_ENV}
    if experiments is not None:
        env[GRPC_EXPERIMENTS_ENV] = experiments
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("module", ENTRY_MODULES)
def test_each_entry_point_sets_tides_default_when_unset(module: str) -> None:
    assert run_entry(module, None) == repr(TIDE_GRPC_EXPERIMENTS)


@pytest.mark.parametrize("module", ["services.gateway.__main__", "tide.cli"])
@pytest.mark.parametrize("operator", ["", "-event_engine_dns"])
def test_an_operators_setting_is_kept(module: str, operator: str) -> None:
    assert run_entry(module, operator) == repr(operator)


def test_the_default_is_set_only_where_nothing_is() -> None:
    env: dict[str, str] = {}
    assert use_tide_grpc_defaults(env) is True
    assert env == {GRPC_EXPERIMENTS_ENV: TIDE_GRPC_EXPERIMENTS}
    assert use_tide_grpc_defaults(env) is False
    kept = {GRPC_EXPERIMENTS_ENV: ""}
    assert use_tide_grpc_defaults(kept) is False and kept == {GRPC_EXPERIMENTS_ENV: ""}


def test_too_late_once_grpc_is_imported() -> None:
    """In a process that imported grpc already, the call changes nothing (and says so)."""
    probe = (
        "import os, grpc\n"
        "from tide.grpc_defaults import use_tide_grpc_defaults\n"
        "print(use_tide_grpc_defaults(), repr(os.environ.get('GRPC_EXPERIMENTS')))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != GRPC_EXPERIMENTS_ENV}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.split() == ["False", "None"], done.stderr
