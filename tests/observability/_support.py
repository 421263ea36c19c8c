"""A real cluster whose every process serves /metrics on a free port (named in its ready
file) and writes its spans as JSON lines, plus a span-reading helper (scraping:
tests/_metrics.py)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._cluster import Cluster
from tests.services.dispatch.conftest import DispatchLauncher
from tests.services.nameserver.process import NameServerLauncher
from tests.services.storage.conftest import StorageLauncher


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


def read_spans(spans_dir: Path) -> list[dict[str, Any]]:
    spans = []
    for path in spans_dir.glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                spans.append(json.loads(line))
    return spans
