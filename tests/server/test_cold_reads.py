"""The cold readers (tide/server/_cold_reads.py), without a process: a read runs on a
thread marked to read through the file; a read keeps its slot until its thread is done
with it, cancelled or not; past ``COLD_READS_IN_FLIGHT`` a read waits for a slot. The
services' use of them, with real processes and files taken out of memory:
tests/services/storage/test_cold_reads.py, tests/services/dispatch/test_cold_reads.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from functools import partial

import pytest

from tide.mapped import reads_through_file
from tide.server import COLD_READS_IN_FLIGHT, ColdReads

WAIT_S = 10.0


async def until(state: Callable[[], bool], what: str) -> None:
    """Wait on the loop (other tasks and callbacks run) until ``state()`` holds."""
    deadline = time.monotonic() + WAIT_S
    while not state():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def test_a_cold_read_runs_on_a_thread_that_reads_through_the_file() -> None:
    async def scenario() -> None:
        cold = ColdReads()
        assert await cold.run(reads_through_file)
        assert not reads_through_file()  # the loop's thread is not marked
        cold.close()

    asyncio.run(scenario())


def test_a_cancelled_cold_read_keeps_its_slot_until_its_thread_is_done() -> None:
    async def scenario() -> None:
        cold = ColdReads()
        started, release = threading.Event(), threading.Event()

        def blocked() -> bytes:
            started.set()
            release.wait(WAIT_S)
            return b"read"

        task = asyncio.create_task(cold.run(blocked))
        await asyncio.to_thread(started.wait, WAIT_S)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cold.in_flight == 1  # its thread still reads: the slot is still taken
        release.set()
        await until(lambda: cold.in_flight == 0, "the slot back")
        cold.close()

    asyncio.run(scenario())


def test_cold_reads_past_the_bound_wait_for_a_slot() -> None:
    async def scenario() -> None:
        cold = ColdReads()
        release = threading.Event()
        ran: list[int] = []

        def blocked(n: int) -> int:
            release.wait(WAIT_S)
            ran.append(n)
            return n

        tasks = [
            asyncio.create_task(cold.run(partial(blocked, n)))
            for n in range(COLD_READS_IN_FLIGHT + 1)
        ]
        await until(lambda: cold.in_flight == COLD_READS_IN_FLIGHT, "the reads handed over")
        assert cold.count == COLD_READS_IN_FLIGHT  # the last waits for a slot
        release.set()
        assert await asyncio.gather(*tasks) == list(range(COLD_READS_IN_FLIGHT + 1))
        assert cold.count == COLD_READS_IN_FLIGHT + 1
        await until(lambda: cold.in_flight == 0, "the slots back")
        cold.close()

    asyncio.run(scenario())
