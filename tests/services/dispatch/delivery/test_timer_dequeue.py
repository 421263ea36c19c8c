"""The timer's dequeue on a record it cannot use: a record that does not decode (or is
gone) is counted undeliverable and the wheel moves past its slot, as the delay levels do;
a bad record must never hold every later slot."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from services.dispatch.delivery.reput import Reput
from services.dispatch.delivery.timer_dequeue import Dequeuer
from services.dispatch.delivery.timer_store import TimerSettings, TimerStore
from services.dispatch.storage_client import StorageClient
from tide.format import TimerWheelGeometry

GEOMETRY = TimerWheelGeometry(precision_ms=1000, slots_total=3600)
T0 = 1_700_000_000_000


class Storage:
    """Answers every read with bytes that are no record, or with nothing (retention)."""

    def __init__(self, answers: list[bytes | None]) -> None:
        self.answers = answers

    async def read_records(self, positions: Sequence[tuple[int, int]]) -> list[bytes | None]:
        return [self.answers[i % len(self.answers)] for i in range(len(positions))]


class Recorder:
    def __init__(self) -> None:
        self.undeliverable_calls: list[tuple[str, str]] = []
        self.put_calls = 0

    def undeliverable(self, source: str, why: str) -> None:
        self.undeliverable_calls.append((source, why))

    async def put(self, due: Sequence[Any]) -> Any:
        self.put_calls += 1
        raise AssertionError("nothing usable should be re-put")


def test_bad_records_are_undeliverable_and_the_slot_fires_once(tmp_path: Path) -> None:
    store = TimerStore(tmp_path, TimerSettings(GEOMETRY, 600, 1 << 20))
    store.open(T0)
    slot = store.file(0, 100, T0 + 2000, 1)
    store.file(100, 100, T0 + 2000, 1)
    reput = Recorder()
    storage = Storage([b"\x00" * 100, None])
    dequeuer = Dequeuer(
        store,
        cast(StorageClient, storage),
        cast(Reput, reput),
        clock_ms=lambda: T0 + 10_000,
    )
    store.read_time_ms = slot

    asyncio.run(dequeuer.fire())

    assert store.read_time_ms == slot + GEOMETRY.precision_ms  # moved past the slot
    reasons = sorted(why for _, why in reput.undeliverable_calls)
    assert len(reasons) == 2 and reput.put_calls == 0
    assert "does not decode" in reasons[0] and "gone from the storage" in reasons[1]
    store.close()
