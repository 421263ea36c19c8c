"""read_through (services/dispatch/read_through.py): tail cache hits first, every miss in
one read call, results in the callers' order; a hit its ``held`` refuses is read too. The
cache is a real TailCache over a made-up commitlog (test_tail_cache's ``LOG``: byte ``i``
at offset ``i``); the read stands in for the storage and records what it was asked."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from services.dispatch.read_through import Position, as_bytes, read_through
from services.dispatch.tail_cache import TailCache
from tests.services.dispatch.test_tail_cache import LOG, chunk


class _Storage:
    """Reads from LOG below ``gone_below`` as None (retention), counts its calls."""

    def __init__(self, gone_below: int = 0) -> None:
        self.calls: list[list[Position]] = []
        self.gone_below = gone_below

    async def read(self, positions: list[Position]) -> list[bytes | None]:
        self.calls.append(list(positions))
        return [
            None if offset < self.gone_below else LOG[offset : offset + size]
            for offset, size in positions
        ]


def _run(
    positions: Sequence[Position], cache: TailCache | None, storage: _Storage
) -> list[bytes | None]:
    return asyncio.run(read_through(positions, cache, as_bytes, storage.read))


def _cache() -> TailCache:
    cache = TailCache(1 << 20)
    cache.add(chunk(1_000, [100, 50, 70]))  # holds [1000, 1220)
    return cache


def test_all_hits_read_nothing() -> None:
    storage = _Storage()
    positions = [(1_100, 50), (1_000, 100), (1_150, 70)]
    assert _run(positions, _cache(), storage) == [LOG[o : o + s] for o, s in positions]
    assert storage.calls == []


def test_misses_in_one_read_in_order() -> None:
    storage = _Storage(gone_below=100)
    positions = [(10, 20), (1_000, 100), (500, 30), (1_150, 70), (1_200, 40)]
    got = _run(positions, _cache(), storage)
    # (1_200, 40) runs past what the cache holds: a miss, not a partial answer
    assert storage.calls == [[(10, 20), (500, 30), (1_200, 40)]]
    assert got == [None, LOG[1_000:1_100], LOG[500:530], LOG[1_150:1_220], LOG[1_200:1_240]]
    assert all(type(data) is bytes for data in got if data is not None)


def test_no_cache_reads_everything() -> None:
    storage = _Storage()
    positions = [(1_000, 100), (5, 5)]
    assert _run(positions, None, storage) == [LOG[1_000:1_100], LOG[5:10]]
    assert storage.calls == [positions]


def test_refused_hit_is_read_from_the_storage() -> None:
    storage = _Storage()

    def held(data: bytes | memoryview, position: Position) -> str | None:
        return None if position[0] == 1_100 else f"cache:{bytes(data)[:2]!r}"

    async def read(misses: list[Position]) -> list[str]:
        storage.calls.append(misses)
        return [f"storage:{offset}" for offset, _ in misses]

    positions = [(1_000, 100), (1_100, 50)]
    got = asyncio.run(read_through(positions, _cache(), held, read))
    assert got == [f"cache:{LOG[1_000:1_002]!r}", "storage:1100"]
    assert storage.calls == [[(1_100, 50)]]


def test_a_short_answer_is_an_error() -> None:
    async def read(misses: list[Position]) -> list[bytes | None]:
        return []

    with pytest.raises(RuntimeError, match="0 results for 1 positions"):
        asyncio.run(read_through([(3, 4)], _cache(), as_bytes, read))
