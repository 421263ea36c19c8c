"""``bench.secret_channel``: one small round of each way, end to end (a real server and
client; no timing asserted: the figures are the benchmark's, docs/benchmarks.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.secret_channel", *args],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def test_a_round_of_each_way_reports_the_cpu_an_exchange() -> None:
    done = _run("--exchanges", "50", "--rounds", "1")
    assert done.returncode == 0, done.stderr
    for way in ("none", "metadata", "interceptor"):
        line = re.search(rf"^median {way} +([0-9.]+) us an exchange", done.stdout, re.M)
        assert line is not None, done.stdout
        assert float(line.group(1)) > 0


def test_out_of_bounds_arguments_are_refused() -> None:
    done = _run("--rounds", "0")
    assert done.returncode == 2
    assert "must be" in done.stderr
