"""``tide console``: the console's own options (it runs as ``python -m services.console``),
and bad options refused with a message naming them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT_S = 60


def tide(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tide.cli", *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_help_lists_the_console_options() -> None:
    done = tide("console", "--help")
    assert done.returncode == 0, done.stderr
    for option in ("--gateway", "--listen", "--session-key-file", "--metrics-endpoint"):
        assert option in done.stdout


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (("--tls-cert-file", "c.pem"), "--tls-cert-file and --tls-key-file go together"),
        (("--page-size-rows", "0"), "--page-size-rows is 0; give 1..1000"),
        (("--gateway", "nohost"), "--gateway 'nohost' is not HOST:PORT"),
        (("--metrics-endpoint", "gateway"), "is not NAME=HOST:PORT"),
    ],
)
def test_bad_options_are_refused(argv: tuple[str, ...], problem: str) -> None:
    done = tide("console", *argv)
    assert done.returncode == 2
    assert problem in done.stderr


def test_a_bad_session_key_file_is_refused(tmp_path: Path) -> None:
    key = tmp_path / "session.key"
    key.write_text("not a key\n")
    done = tide("console", "--listen", "127.0.0.1:0", "--session-key-file", str(key))
    assert done.returncode == 2
    assert "not a Fernet key" in done.stderr
