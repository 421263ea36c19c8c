"""``bench.server_methods``: one small round of each kind, end to end (real server and
client processes; no timing asserted: the figures are the benchmark's,
docs/benchmarks.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.server_methods", *args],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_a_round_of_each_kind_reports_the_servers_cpu_a_call() -> None:
    done = _run("--methods", "3", "--calls", "200", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    for kind in ("registered", "generic"):
        line = re.search(rf"^median {kind} +\(3 methods\) +([0-9.]+) us/call", done.stdout, re.M)
        assert line is not None, done.stdout
        assert float(line.group(1)) > 0


@pytest.mark.parametrize(
    "args", [("--methods", "0"), ("--calls", "0"), ("--rounds", "101")], ids=str
)
def test_out_of_bounds_arguments_are_refused(args: tuple[str, str]) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert "must be" in done.stderr
