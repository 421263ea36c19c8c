"""``bench.server_methods`` and ``bench.secret_channel`` (grpc.aio's per-call costs that
the services avoid): one small round of each kind, end to end, in real processes. No
timing is asserted: the figures are the benchmarks', docs/benchmarks.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _median(stdout: str, pattern: str) -> float:
    line = re.search(rf"^median {pattern} +([0-9.]+) us", stdout, re.M)
    assert line is not None, stdout
    return float(line.group(1))


def test_server_methods_reports_the_servers_cpu_a_call_of_each_kind() -> None:
    done = _run("bench.server_methods", "--methods", "3", "--calls", "200", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    for kind in ("registered", "generic"):
        assert _median(done.stdout, rf"{kind} +\(3 methods\)") > 0


def test_secret_channel_reports_the_cpu_an_exchange_of_each_way() -> None:
    done = _run("bench.secret_channel", "--exchanges", "50", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    for way in ("none", "metadata", "interceptor"):
        assert _median(done.stdout, way) > 0


@pytest.mark.parametrize(
    "command",
    [
        ("bench.server_methods", "--methods", "0"),
        ("bench.server_methods", "--calls", "0"),
        ("bench.server_methods", "--rounds", "101"),
        ("bench.secret_channel", "--rounds", "0"),
        ("bench.secret_channel", "--exchanges", "0"),
    ],
    ids=" ".join,
)
def test_out_of_bounds_arguments_are_refused(command: tuple[str, ...]) -> None:
    done = _run(*command)
    assert done.returncode == 2
    assert "must be" in done.stderr
