"""TailFollower against a real storage process (tests/services/storage/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from tests._ports import free_port
from tests.services.storage.conftest import (
    SEGMENT_BYTES,
    StorageLauncher,
    StorageProcess,
    launcher,
    message,
    shared_storage,
)
from tide.format import decode_record, segment_name
from tide.tail import (
    Backoff,
    RecordAt,
    TailCorruptionError,
    TailOutOfRangeError,
    TailUnavailableError,
)
from tide.tail.follower import CHANNEL_OPTIONS, TailFollower
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until_async

__all__ = ["launcher", "shared_storage"]  # fixtures, re-used from the storage tests

SEGMENT_ARGS = ("--segment-size-bytes", str(SEGMENT_BYTES))
DEADLINE_S = 30.0
MAX_BODY = 40_000  # below the test processes' --max-message-body-bytes (64 KiB)
BODY_POS_V4 = 88  # formats.md: the body follows 88 header bytes (IPv4 hosts)


@dataclass
class Appended:
    """What was appended, in commitlog order."""

    messages: list[pb.Message] = field(default_factory=list)
    results: list[pb.AppendResult] = field(default_factory=list)

    @property
    def end(self) -> int:
        last = self.results[-1]
        return last.physical_offset + last.size

    def extend(self, other: Appended) -> None:
        self.messages += other.messages
        self.results += other.results


def append_bytes(
    storage: StorageProcess, topic: str, total: int, seed: int, batch: int = 10
) -> Appended:
    """Append batches of random-size messages until ``total`` bytes are in."""
    rng = random.Random(seed)
    out = Appended()
    written = 0
    while written < total:
        sent = [
            message(topic, i % 4, f"{seed}-{len(out.messages) + i}:".encode() + b"v" * size)
            for i, size in enumerate(rng.randrange(0, MAX_BODY) for _ in range(batch))
        ]
        results = storage.append(sent)
        out.messages += sent
        out.results += results
        written += sum(r.size for r in results)
    return out


def check_delivered(got: list[RecordAt], appended: Appended) -> None:
    """Every appended record exactly once, in order, at its offset, with its bytes."""
    assert [(r.offset, r.size) for r in got] == [
        (a.physical_offset, a.size) for a in appended.results
    ]
    for rec, sent, result in zip(got, appended.messages, appended.results, strict=True):
        decoded = decode_record(rec.data, 0, rec.size, expected_offset=rec.offset)
        assert (decoded.topic, decoded.queue_id, decoded.body) == (
            sent.topic,
            sent.queue_id,
            sent.body,
        )
        assert rec.scan.queue_offset == decoded.queue_offset == result.queue_offset


async def follow_until(
    follower: TailFollower, done: Callable[[], bool], got: list[RecordAt]
) -> None:
    """Collect batches into ``got`` until ``done()`` (checked after every batch)."""
    async with contextlib.aclosing(follower.records()) as batches:
        async for batch in batches:
            got.extend(batch)
            if done():
                return


async def reach_then_close(follower: TailFollower, end: int, task: asyncio.Task[None]) -> None:
    """Wait until the follower has delivered everything before ``end``, close it, and
    check that its consumer ``task`` ends cleanly."""
    await wait_until_async(
        lambda: follower.next_offset >= end or task.done(),
        f"the follower to deliver up to {end}",
        DEADLINE_S,
        state=lambda: f"next offset {follower.next_offset}",
    )
    await follower.close()
    await asyncio.wait_for(task, DEADLINE_S)  # re-raises the consumer's error, if any


def small_window_channel(target: str) -> grpc.aio.Channel:
    """No BDP probing: the flow-control window stays at 64 KiB, so a paused follower
    leaves the rest of the stream unsent (else gRPC may buffer megabytes of it)."""
    options = [*CHANNEL_OPTIONS, ("grpc.http2.bdp_probe", 0)]
    return grpc.aio.insecure_channel(target, options=options)


def resume_offsets(records: list[logging.LogRecord]) -> list[int]:
    """The offsets in the follower's "reconnecting from offset N" log lines."""
    found = (re.search(r"reconnecting from offset (\d+)", r.getMessage()) for r in records)
    return [int(m.group(1)) for m in found if m]


# -- against a real storage process ----------------------------------------------------
def test_follow_from_zero_across_segments(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = launcher.start(tmp_path / "store", *SEGMENT_ARGS)
    appended = append_bytes(storage, "FromZero", 3 * SEGMENT_BYTES + 100_000, seed=1)
    status = storage.status()
    assert status.max_offset == appended.end
    assert status.segment_count >= 4

    async def run() -> tuple[list[RecordAt], TailFollower]:
        got: list[RecordAt] = []
        async with TailFollower(storage.listen, 0, max_chunk_bytes=100_000) as follower:
            await asyncio.wait_for(
                follow_until(follower, lambda: follower.next_offset >= appended.end, got),
                DEADLINE_S,
            )
        return got, follower

    got, follower = asyncio.run(run())
    check_delivered(got, appended)
    assert follower.next_offset == appended.end
    assert follower.max_offset == appended.end
    assert follower.lag_bytes == 0
    assert follower.reconnects == 0
    storage.stop()


def test_follow_from_the_max_offset_receives_new_appends(shared_storage: StorageProcess) -> None:
    start = shared_storage.status().max_offset
    appended = Appended()

    async def run() -> list[RecordAt]:
        got: list[RecordAt] = []
        async with TailFollower(shared_storage.listen, start) as follower:
            task = asyncio.create_task(follow_until(follower, lambda: False, got))
            for round_ in range(3):  # ~1.8 MB: at least one segment roll while following
                more = await asyncio.to_thread(
                    append_bytes, shared_storage, "Live", 600_000, 10 + round_
                )
                appended.extend(more)
            await reach_then_close(follower, appended.end, task)
        return got

    got = asyncio.run(run())
    assert appended.results[0].physical_offset == start
    check_delivered(got, appended)


def test_offset_past_the_max_is_out_of_range(shared_storage: StorageProcess) -> None:
    end = shared_storage.status().max_offset

    async def run() -> TailFollower:
        async with TailFollower(shared_storage.listen, end + 1) as follower:
            with pytest.raises(TailOutOfRangeError) as info:
                await asyncio.wait_for(follow_until(follower, lambda: True, []), DEADLINE_S)
        assert info.value.offset == end + 1
        assert f"past the commitlog max offset {end}" in str(info.value)
        return follower

    started = time.monotonic()
    follower = asyncio.run(run())
    assert follower.reconnects == 0, "OUT_OF_RANGE must not be retried"
    assert time.monotonic() - started < 5


def test_a_corrupt_record_stops_the_follower_after_the_good_ones(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    """Normal recovery verifies only the last three segments: a body flipped in the first
    of five is served, and the follower delivers every record before it, then raises."""
    store = tmp_path / "store"
    storage = launcher.start(store, *SEGMENT_ARGS)
    appended = append_bytes(storage, "Corrupt", 4 * SEGMENT_BYTES + 100_000, seed=4)
    storage.stop()
    bad = next(r for r in appended.results[5:] if r.size > BODY_POS_V4 + 10)
    segment = store / "commitlog" / segment_name(0)
    with segment.open("r+b") as file:
        file.seek(bad.physical_offset + BODY_POS_V4 + 5)
        byte = file.read(1)
        file.seek(-1, 1)
        file.write(bytes([byte[0] ^ 0xFF]))
    again = launcher.start(store, *SEGMENT_ARGS)

    async def run() -> tuple[list[RecordAt], TailFollower]:
        got: list[RecordAt] = []
        async with TailFollower(again.listen, 0) as follower:
            with pytest.raises(TailCorruptionError, match="CRC") as info:
                await asyncio.wait_for(follow_until(follower, lambda: False, got), DEADLINE_S)
        assert info.value.offset == bad.physical_offset
        return got, follower

    got, follower = asyncio.run(run())
    assert [r.offset for r in got] == [
        r.physical_offset for r in appended.results if r.physical_offset < bad.physical_offset
    ]
    assert follower.next_offset == bad.physical_offset
    assert follower.reconnects == 0
    again.stop()


@dataclass
class Pause:
    """Holds the consumer once, mid-stream, until the test lets it go."""

    after_offset: int
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def maybe_wait(self, follower: TailFollower) -> None:
        if follower.next_offset >= self.after_offset and not self.release.is_set():
            self.reached.set()
            await self.release.wait()


ENDED = "the server ended the stream"


@pytest.mark.parametrize(
    ("how", "where", "first_reasons"),
    [
        # Caught up: the server's drain ends the idle stream (status OK).
        ("sigterm", "idle", (ENDED,)),
        # Behind: drain ends the stream between two chunks, unless the server is blocked
        # sending one (flow control); then the shutdown grace (2 s here) runs out and the
        # server cancels the call.
        ("sigterm", "lagging", (ENDED, "UNAVAILABLE")),
        ("sigkill", "lagging", ("UNAVAILABLE",)),
    ],
)
def test_reconnects_across_a_restart_exactly_once(
    launcher: StorageLauncher,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    how: str,
    where: str,
    first_reasons: tuple[str, ...],
) -> None:
    """The storage stops while the follower is caught up or far behind, comes back on
    the same store and port, and takes more appends: every record arrives exactly once."""
    caplog.set_level(logging.INFO, logger="tide.tail")
    store = tmp_path / "store"
    args = ("--listen", f"127.0.0.1:{free_port()}", "--shutdown-grace-s", "2", *SEGMENT_ARGS)
    storage = launcher.start(store, *args)
    appended = append_bytes(storage, "Restart", 3 * SEGMENT_BYTES, seed=2)
    first_end = appended.end

    async def consume(follower: TailFollower, pause: Pause, got: list[RecordAt]) -> None:
        async with contextlib.aclosing(follower.records()) as batches:
            async for batch in batches:
                got.extend(batch)
                await pause.maybe_wait(follower)

    async def run() -> tuple[list[RecordAt], TailFollower]:
        got: list[RecordAt] = []
        pause = Pause(after_offset=200_000 if where == "lagging" else first_end)
        follower = TailFollower(
            storage.listen, 0, max_chunk_bytes=7001, channel_factory=small_window_channel
        )
        async with follower:
            task = asyncio.create_task(consume(follower, pause, got))
            await asyncio.wait_for(pause.reached.wait(), DEADLINE_S)
            await asyncio.to_thread(storage.stop if how == "sigterm" else storage.kill)
            pause.release.set()
            # The stream's end, then at least one refused connection (asserted below).
            await wait_until_async(
                lambda: follower.reconnects >= 2, "the follower to find the server gone", 10
            )
            again = await asyncio.to_thread(launcher.start, store, *args)
            assert again.listen == storage.listen
            more = await asyncio.to_thread(append_bytes, again, "Restart", SEGMENT_BYTES, 3)
            assert more.results[0].physical_offset == first_end
            appended.extend(more)
            await reach_then_close(follower, appended.end, task)
            await asyncio.to_thread(again.stop)
        return got, follower

    got, follower = asyncio.run(run())
    check_delivered(got, appended)
    reconnects = [r for r in caplog.records if "reconnecting from offset" in r.getMessage()]
    assert len(reconnects) == follower.reconnects >= 2  # the end, then refused connections
    assert all(r.levelno == logging.INFO for r in reconnects)
    assert any(reason in reconnects[0].getMessage() for reason in first_reasons)
    resumed = resume_offsets(reconnects)
    if where == "lagging":
        assert resumed[0] < first_end, f"the stream ended at {resumed[0]}, not mid-stream"
    else:
        assert resumed[0] == first_end
    assert all(offset in {r.offset for r in got} | {first_end} for offset in resumed)


# -- without a server --------------------------------------------------------------------
def test_gives_up_after_max_consecutive_failures(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tide.tail")
    target = f"127.0.0.1:{free_port()}"  # nothing listens there

    async def run() -> TailFollower:
        follower = TailFollower(target, 0, max_consecutive_failures=3)
        with pytest.raises(TailUnavailableError, match="after 3 consecutive failures") as info:
            await asyncio.wait_for(follow_until(follower, lambda: True, []), DEADLINE_S)
        assert info.value.failures == 3
        assert "UNAVAILABLE" in info.value.reason
        await follower.close()
        return follower

    started = time.monotonic()
    follower = asyncio.run(run())
    assert follower.reconnects == 2
    assert time.monotonic() - started < 5
    logged = [r for r in caplog.records if "reconnecting from offset 0" in r.getMessage()]
    assert len(logged) == 2
    assert all(r.levelno == logging.INFO and "UNAVAILABLE" in r.getMessage() for r in logged)


def test_retries_back_off_and_close_ends_the_iteration() -> None:
    target = f"127.0.0.1:{free_port()}"

    async def run() -> TailFollower:
        follower = TailFollower(target, 0)
        task = asyncio.create_task(follow_until(follower, lambda: False, []))
        # Deliberately lets time pass: the retries in one second are what is checked.
        await asyncio.sleep(1.0)
        assert not task.done()
        await follower.close()
        await asyncio.wait_for(task, 5)  # ends without an error
        return follower

    follower = asyncio.run(run())
    # 50 + 100 + 200 + 400 ms (less jitter) fit in a second: no busy loop.
    assert 2 <= follower.reconnects <= 6, follower.reconnects
    assert follower.closed


def test_close_while_streaming_ends_the_iteration(shared_storage: StorageProcess) -> None:
    async def run() -> None:
        follower = TailFollower(shared_storage.listen, shared_storage.status().max_offset)
        got: list[RecordAt] = []
        task = asyncio.create_task(follow_until(follower, lambda: False, got))
        # The stream is open once a record appended now comes over it; then it idles.
        await asyncio.to_thread(shared_storage.append, [message("Idle", 0, b"x")])
        await wait_until_async(lambda: bool(got), "a record over the open stream", DEADLINE_S)
        assert not task.done()
        await follower.close()
        await asyncio.wait_for(task, 5)
        assert follower.reconnects == 0

    asyncio.run(run())


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="offset"):
        TailFollower("127.0.0.1:1", -1)
    with pytest.raises(ValueError, match="max_chunk_bytes"):
        TailFollower("127.0.0.1:1", 0, max_chunk_bytes=4 * 1024 * 1024 + 1)
    with pytest.raises(ValueError, match="max_consecutive_failures"):
        TailFollower("127.0.0.1:1", 0, max_consecutive_failures=0)


def test_backoff_doubles_up_to_the_cap_with_jitter() -> None:
    exact = Backoff(jitter=0)
    assert [exact.delay_s(n) for n in range(1, 8)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0]
    assert exact.delay_s(10_000) == 2.0
    jittered = Backoff(rng=random.Random(3))
    delays = [jittered.delay_s(1) for _ in range(100)]
    assert all(0.0375 <= d <= 0.05 for d in delays)
    assert len(set(delays)) > 1
    with pytest.raises(ValueError, match="attempt"):
        exact.delay_s(0)
