"""``python -m tide.health_probe`` (the Kubernetes exec probe of the TLS overlay) against
a real name server with TLS: SERVING with the pod's certificate, a failure with a
certificate another CA signed (mutual TLS refuses it) and for an unknown service."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._cluster import tls_flags
from tests._service_process import REPO_ROOT, child_env
from tests.services.nameserver.process import NameServerLauncher, NameServerProcess
from tide.certs import make_ca, make_leaf
from tide.health_probe import secret_files

PROBE_TIMEOUT_S = 30.0


def secret_dir(root: Path, name: str) -> Path:
    """A directory laid out as a mounted kubernetes.io/tls Secret with ca.crt."""
    directory = root / name
    authority = make_ca(root / f"{name}-ca")
    leaf = make_leaf(authority, root / f"{name}-leaf", name)
    directory.mkdir()
    os.symlink(leaf.cert_file, directory / "tls.crt")
    os.symlink(leaf.key_file, directory / "tls.key")
    os.symlink(leaf.ca_file, directory / "ca.crt")
    return directory


@pytest.fixture
def tls_nameserver(tmp_path: Path) -> Iterator[tuple[NameServerProcess, Path, Path]]:
    pod = secret_dir(tmp_path, "pod")
    other = secret_dir(tmp_path, "other")
    launcher = NameServerLauncher(tmp_path / "run")
    try:
        yield launcher.start(*tls_flags(secret_files(pod))), pod, other
    finally:
        launcher.close()


def probe(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tide.health_probe", str(port), *args],
        cwd=REPO_ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=False,
    )


def test_probe_passes_with_the_pod_certificate_and_fails_otherwise(
    tls_nameserver: tuple[NameServerProcess, Path, Path],
) -> None:
    process, pod, other = tls_nameserver
    ok = probe(process.port, "tide.v1.NameServer", "--tls-dir", str(pod))
    assert ok.returncode == 0, ok.stderr
    assert probe(process.port, "--tls-dir", str(pod)).returncode == 0
    foreign = probe(process.port, "--tls-dir", str(other))
    assert foreign.returncode == 1
    assert "not serving: UNAVAILABLE" in foreign.stderr, foreign.stderr
    unknown = probe(process.port, "no.such.Service", "--tls-dir", str(pod))
    assert unknown.returncode == 1
    assert "NOT_FOUND" in unknown.stderr, unknown.stderr
