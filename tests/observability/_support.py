"""A real cluster whose every process serves /metrics on a free port (named in its ready
file) and writes its spans as JSON lines, plus scraping and span-reading helpers."""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._cluster import Cluster
from tests.services.dispatch.conftest import DispatchLauncher
from tests.services.nameserver.process import NameServerLauncher
from tests.services.storage.conftest import StorageLauncher

SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def telemetry_args(spans_dir: Path) -> tuple[str, ...]:
    return (
        "--metrics-listen",
        "127.0.0.1:0",
        "--otel-traces-exporter",
        "file",
        "--otel-traces-file",
        str(spans_dir / "{service}-{pid}.jsonl"),
    )


@contextlib.contextmanager
def telemetry_cluster(root: Path, spans_dir: Path, **cluster_args: Any) -> Iterator[Cluster]:
    """A started :class:`Cluster` with the telemetry flags on every process (the launchers
    are wrapped for the duration, so tests/_cluster.py needs no option for it)."""
    extra = telemetry_args(spans_dir)
    storage_spawn = StorageLauncher.spawn
    dispatch_spawn = DispatchLauncher.spawn
    nameserver_start = NameServerLauncher.start

    def spawn_storage(self: StorageLauncher, store_dir: Path, *args: str, **kw: Any) -> Any:
        return storage_spawn(self, store_dir, *args, *extra, **kw)

    def spawn_dispatch(self: DispatchLauncher, store_dir: Path, storage: str, *args: str) -> Any:
        return dispatch_spawn(self, store_dir, storage, *args, *extra)

    def start_nameserver(self: NameServerLauncher, *args: str) -> Any:
        return nameserver_start(self, *args, *extra)

    gateway_args = (*cluster_args.pop("gateway_args", ()), *extra)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StorageLauncher, "spawn", spawn_storage)
        patch.setattr(DispatchLauncher, "spawn", spawn_dispatch)
        patch.setattr(NameServerLauncher, "start", start_nameserver)
        with Cluster(root, gateway_args=gateway_args, **cluster_args) as cluster:
            yield cluster


def scrape(address: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample (labels kept as printed)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE_RE.match(line)
        if match and not line.startswith("#"):
            samples[match.group(1) + (match.group(2) or "")] = float(match.group(3))
    return samples


def total(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of ``name``'s samples whose labels include ``labels``."""
    found = 0.0
    for key, value in samples.items():
        metric, _, rest = key.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            found += value
    return found


def families(samples: dict[str, float]) -> set[str]:
    return {key.partition("{")[0] for key in samples}


def wait_until(
    check: Callable[[], bool], what: str, timeout_s: float = 30.0, show: Callable[[], object] = str
) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}: {show()}")
        time.sleep(0.2)


def read_spans(spans_dir: Path) -> list[dict[str, Any]]:
    spans = []
    for path in spans_dir.glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                spans.append(json.loads(line))
    return spans
