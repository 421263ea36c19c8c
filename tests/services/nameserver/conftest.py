"""Fixtures: name server processes started per test (``nameservers``) or per module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.nameserver.process import NameServerLauncher, NameServerProcess


@pytest.fixture
def nameservers(tmp_path: Path) -> Iterator[NameServerLauncher]:
    launcher = NameServerLauncher(tmp_path / "procs")
    try:
        yield launcher
    finally:
        launcher.close()


@pytest.fixture(scope="module")
def shared_nameserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NameServerProcess]:
    """One name server for the tests that only make calls; each uses its own names."""
    launcher = NameServerLauncher(tmp_path_factory.mktemp("shared") / "procs")
    try:
        process = launcher.start()
        yield process
        process.stop()
    finally:
        launcher.close()
