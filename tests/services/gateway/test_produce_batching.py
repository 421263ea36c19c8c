"""The produce path's batch-wise steps give what their one-at-a-time forms give: unique
keys, round robin, message checks; and the coalescing Append queue keeps every group's
outcome its own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest

from services.gateway import append_queue
from services.gateway.append_queue import AppendQueue, Outcome
from services.gateway.uniq import UniqueKeyGenerator
from services.gateway.validate import check_produce_message, check_produce_messages
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb


# -- unique keys ---------------------------------------------------------------------
@pytest.mark.parametrize("count", [1, 7, 100, 70_000])
def test_next_many_is_next_called_count_times(count: int) -> None:
    def generator() -> UniqueKeyGenerator:
        return UniqueKeyGenerator(
            ip=bytes([10, 0, 0, 1]), pid=7, process_value=9, clock_ms=lambda: 1_800_000_000_000
        )

    one_by_one, at_once = generator(), generator()
    one_by_one.next()  # counters not at zero, and wrapping for the large count
    at_once.next()
    assert at_once.next_many(count) == [one_by_one.next() for _ in range(count)]
    assert at_once.next() == one_by_one.next()  # both counters moved alike


def test_next_many_time_part_matches_java_int_cast() -> None:
    now = [0]
    generator = UniqueKeyGenerator(ip=bytes(4), pid=1, process_value=1, clock_ms=lambda: now[0])
    now[0] = generator._start_ms - 5_000_000  # far back: a negative Java int, not clamped
    key = generator.next_many(1)[0]
    assert key[20:28] == f"{(-5_000_000) & 0xFFFFFFFF:08X}"


# -- message checks ------------------------------------------------------------------
def _first_error(check: Callable[[], object]) -> str | None:
    try:
        check()
    except ServiceError as exc:
        return exc.message
    return None


def _one_by_one(messages: list[pb.ProduceMessage]) -> None:
    for index, message in enumerate(messages):
        check_produce_message(index, message, 1_000)


PLAIN = {"topic": "T1", "body": b"x"}


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"topic": "bad topic!"},
        {"body": b""},
        {"body": b"x" * 1_001},
        {"tags": "a\x01b"},
        {"keys": ["has space"]},
        {"properties": {"UNIQ_KEY": "v"}},
        {"unique_key": "has space"},
        {"born_timestamp_ms": -1},
        {"queue": pb.QueueRef(broker_name="", queue_id=1)},
        {"sharding_key": "k" * 2_000},
        {"tags": "TagA", "keys": ["k1", "k2"], "properties": {"a": "b"}, "unique_key": "U1"},
    ],
)
@pytest.mark.parametrize("position", [0, 2])
def test_batch_check_gives_the_first_error_of_the_one_by_one_check(
    bad: dict[str, object], position: int
) -> None:
    messages = [pb.ProduceMessage(**PLAIN) for _ in range(4)]  # type: ignore[arg-type]
    messages[position] = pb.ProduceMessage(**{**PLAIN, **bad})  # type: ignore[arg-type]
    messages[3] = pb.ProduceMessage(topic="other topic?", body=b"x")  # a later bad topic
    expected = _first_error(lambda: _one_by_one(messages))
    assert expected is not None
    assert _first_error(lambda: check_produce_messages(messages, 1_000)) == expected
    sized = size_of(messages)
    assert _first_error(lambda: check_produce_messages(messages, 1_000, sized)) == expected


def size_of(messages: list[pb.ProduceMessage]) -> int:
    """The encoded size of the request of ``messages`` (the produce path passes it)."""
    return pb.ProduceRequest(messages=messages).ByteSize()


def test_batch_check_passes_valid_messages() -> None:
    messages = [
        pb.ProduceMessage(topic="T1", body=b"x"),
        pb.ProduceMessage(topic="T2", body=b"y", tags="A", keys=["k"], born_timestamp_ms=5),
        pb.ProduceMessage(topic="T1", body=b"z", queue=pb.QueueRef(broker_name="b", queue_id=1)),
    ]
    assert check_produce_messages(messages, 1_000) == (
        {"T1", "T2"},
        True,
        False,
        False,
        False,
        False,
        False,
    )
    sized = size_of(messages)
    assert check_produce_messages(messages, 1_000, sized) == (
        {"T1", "T2"},
        True,
        False,
        False,
        False,
        False,
        False,
    )


def test_batch_check_says_when_no_message_is_routed() -> None:
    messages = [pb.ProduceMessage(topic="T1", body=b"x", tags="A") for _ in range(3)]
    assert check_produce_messages(messages, 1_000) == (
        {"T1"},
        False,
        False,
        False,
        False,
        False,
        False,
    )
    sized = size_of(messages)
    assert check_produce_messages(messages, 1_000, sized) == (
        {"T1"},
        False,
        False,
        False,
        False,
        False,
        False,
    )


@pytest.mark.parametrize(
    ("extra", "bodies_only"),
    [({}, True), ({"flag": 1}, False), ({"born_timestamp_ms": 5}, False), ({"tags": "A"}, False)],
)
def test_batch_check_says_when_messages_are_bodies_only(
    extra: dict[str, object], bodies_only: bool
) -> None:
    messages = [pb.ProduceMessage(topic="T", body=b"x")] * 2
    messages.append(pb.ProduceMessage(topic="T", body=b"y", **extra))  # type: ignore[arg-type]
    assert check_produce_messages(messages, 1_000).bodies_only is bodies_only
    sized = check_produce_messages(messages, 1_000, size_of(messages))
    assert sized == ({"T"}, False, bodies_only, False, False, False, False)  # none is typed


@pytest.mark.parametrize(
    "extra",
    [{"delay_level": 1}, {"deliver_at_ms": 5}, {"delay_ms": 5}, {"tags": "A", "delay_ms": 5}],
)
def test_batch_check_says_when_a_message_is_delayed(extra: dict[str, object]) -> None:
    """A delayed message takes the general path (its record is rewritten, scheduled.py)."""
    messages = [pb.ProduceMessage(topic="T", body=b"x")] * 2
    messages.append(pb.ProduceMessage(topic="T", body=b"y", **extra))  # type: ignore[arg-type]
    for sized in (None, size_of(messages)):
        check = check_produce_messages(messages, 1_000, sized)
        assert check.delayed and check.typed and not check.bodies_only


# -- the coalescing Append queue -----------------------------------------------------
def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, debug_error_string=""
    )


def _request(*offsets: int) -> bytes:
    return storage_pb.AppendRequest(
        messages=[storage_pb.Message(topic="T", queue_id=offset) for offset in offsets]
    ).SerializeToString()


class FakeStorage:
    """Answers each message with its queue_id as the physical offset; a message with
    queue_id 666 makes the call fail INVALID_ARGUMENT; calls wait for ``gate``."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.gate = asyncio.Event()
        self.fail_with: grpc.aio.AioRpcError | None = None

    async def append(self, data: bytes, timeout_s: float) -> storage_pb.AppendResponse:
        ids = [message.queue_id for message in storage_pb.AppendRequest.FromString(data).messages]
        self.calls.append(ids)
        await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        if 666 in ids:
            raise _rpc_error(grpc.StatusCode.INVALID_ARGUMENT, "message[x]: bad")
        return storage_pb.AppendResponse(
            results=[storage_pb.AppendResult(physical_offset=qid) for qid in ids]
        )


def _offsets(outcome: Outcome) -> list[int]:
    results = outcome.response.results[outcome.start : outcome.end]
    return [result.physical_offset for result in results]


def test_groups_waiting_for_a_slot_go_in_one_call() -> None:
    asyncio.run(_groups_waiting_for_a_slot_go_in_one_call())


async def _groups_waiting_for_a_slot_go_in_one_call() -> None:
    storage = FakeStorage()
    queue = AppendQueue(storage.append, asyncio.Semaphore(10), max_in_flight=1)
    first = asyncio.ensure_future(queue.append(_request(1), 1, 5.0))
    await asyncio.sleep(0)
    waiting = [asyncio.ensure_future(queue.append(_request(n, n + 1), 2, 5.0)) for n in (10, 20)]
    await asyncio.sleep(0)
    assert storage.calls == [[1]]  # one call in flight; the others wait
    storage.gate.set()
    first_outcome = await first
    assert _offsets(first_outcome) == [1]
    outcomes = await asyncio.gather(*waiting)
    assert storage.calls == [[1], [10, 11, 20, 21]]  # the waiting groups together
    assert [_offsets(outcome) for outcome in outcomes] == [[10, 11], [20, 21]]
    assert queue.in_flight == 0


def test_a_coalesced_call_that_fails_is_sent_again_group_by_group() -> None:
    asyncio.run(_a_coalesced_call_that_fails_is_sent_again_group_by_group())


async def _a_coalesced_call_that_fails_is_sent_again_group_by_group() -> None:
    storage = FakeStorage()
    queue = AppendQueue(storage.append, asyncio.Semaphore(10), max_in_flight=1)
    first = asyncio.ensure_future(queue.append(_request(1), 1, 5.0))
    await asyncio.sleep(0)
    good = asyncio.ensure_future(queue.append(_request(2), 1, 5.0))
    bad = asyncio.ensure_future(queue.append(_request(666), 1, 5.0))
    storage.gate.set()
    await first
    assert _offsets(await good) == [2]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await bad
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert storage.calls == [[1], [2, 666], [2], [666]]


def test_an_unreachable_storage_fails_every_group_of_the_call() -> None:
    asyncio.run(_an_unreachable_storage_fails_every_group_of_the_call())


async def _an_unreachable_storage_fails_every_group_of_the_call() -> None:
    storage = FakeStorage()
    queue = AppendQueue(storage.append, asyncio.Semaphore(10), max_in_flight=1)
    first = asyncio.ensure_future(queue.append(_request(1), 1, 5.0))
    await asyncio.sleep(0)
    others = [asyncio.ensure_future(queue.append(_request(n), 1, 5.0)) for n in (2, 3)]
    await asyncio.sleep(0)
    storage.fail_with = _rpc_error(grpc.StatusCode.UNAVAILABLE, "down")
    storage.gate.set()
    for call in (first, *others):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert storage.calls == [[1], [2, 3]]  # not sent one by one: they go elsewhere


def test_a_cancelled_waiting_group_is_not_sent_and_limits_hold() -> None:
    asyncio.run(_a_cancelled_waiting_group_is_not_sent_and_limits_hold())


async def _a_cancelled_waiting_group_is_not_sent_and_limits_hold() -> None:
    storage = FakeStorage()
    queue = AppendQueue(
        storage.append, asyncio.Semaphore(10), max_in_flight=1, max_messages=3, max_bytes=1 << 20
    )
    first = asyncio.ensure_future(queue.append(_request(1), 1, 5.0))
    await asyncio.sleep(0)
    gone = asyncio.ensure_future(queue.append(_request(2), 1, 5.0))
    kept = [asyncio.ensure_future(queue.append(_request(n, n), 2, 5.0)) for n in (3, 4)]
    await asyncio.sleep(0)
    gone.cancel()
    storage.gate.set()
    await first
    outcomes = await asyncio.gather(*kept)
    assert [_offsets(outcome) for outcome in outcomes] == [[3, 3], [4, 4]]
    assert storage.calls == [[1], [3, 3], [4, 4]]  # 2 was cancelled; 3 messages at most


def test_plain_and_idempotent_groups_never_share_a_call() -> None:
    asyncio.run(_plain_and_idempotent_groups_never_share_a_call())


async def _plain_and_idempotent_groups_never_share_a_call() -> None:
    storage = FakeStorage()
    queue = AppendQueue(storage.append, asyncio.Semaphore(10), max_in_flight=1)
    first = asyncio.ensure_future(queue.append(_request(1), 1, 5.0))
    await asyncio.sleep(0)
    runs, plain = append_queue.PRODUCER_RUNS, append_queue.PLAIN
    kinds = [runs, runs, plain, runs]
    waiting = [
        asyncio.ensure_future(queue.append(_request(n), 1, 5.0, kind=kind))
        for n, kind in zip((2, 3, 4, 5), kinds, strict=True)
    ]
    await asyncio.sleep(0)
    storage.gate.set()
    await first
    outcomes = await asyncio.gather(*waiting)
    # In order, a call taking the waiting groups while they are of its first one's kind.
    assert storage.calls == [[1], [2, 3], [4], [5]]
    assert [_offsets(outcome) for outcome in outcomes] == [[2], [3], [4], [5]]


def test_a_lone_single_message_does_not_wait_behind_a_batch() -> None:
    asyncio.run(_a_lone_single_message_does_not_wait_behind_a_batch())


async def _a_lone_single_message_does_not_wait_behind_a_batch() -> None:
    storage = FakeStorage()
    queue = AppendQueue(storage.append, asyncio.Semaphore(10), max_in_flight=1, small_in_flight=1)
    batch = asyncio.ensure_future(queue.append(_request(1, 2), 2, 5.0))
    await asyncio.sleep(0)
    lone = asyncio.ensure_future(queue.append(_request(3), 1, 5.0))
    await asyncio.sleep(0)
    assert storage.calls == [[1, 2], [3]]  # the batch's slot, then the small one: no wait
    assert queue.in_flight == 2
    runs = append_queue.PRODUCER_RUNS
    waiting = [
        # a lone message's call is in flight: the next lone ones wait for a slot
        asyncio.ensure_future(queue.append(_request(4), 1, 5.0)),
        asyncio.ensure_future(queue.append(_request(5, 6), 2, 5.0)),
        asyncio.ensure_future(queue.append(_request(7), 1, 5.0)),
        asyncio.ensure_future(queue.append(_request(8), 1, 5.0, kind=runs)),
    ]
    await asyncio.sleep(0)
    assert storage.calls == [[1, 2], [3]]
    storage.gate.set()
    outcomes = await asyncio.gather(batch, lone, *waiting)
    assert [_offsets(outcome) for outcome in outcomes] == [[1, 2], [3], [4], [5, 6], [7], [8]]
    assert storage.calls[2:] == [[4, 5, 6, 7], [8]]  # the waiting ones coalesce, by kind
    assert queue.in_flight == 0


def test_single_messages_coalesce_with_each_other() -> None:
    """Callers sending one message each (issue 21 target 3): while one's call is in flight
    the others wait and go together, as the ceiling's relay joins them; with no call in
    flight the next goes at once again."""
    asyncio.run(_single_messages_coalesce_with_each_other())


async def _single_messages_coalesce_with_each_other() -> None:
    storage = FakeStorage()
    queue = AppendQueue(storage.append, asyncio.Semaphore(10), max_in_flight=1, small_in_flight=1)
    calls = [asyncio.ensure_future(queue.append(_request(n), 1, 5.0)) for n in (1, 2, 3, 4)]
    await asyncio.sleep(0)
    assert storage.calls == [[1]]  # the small slot is not for a second lone message
    assert queue.in_flight == 1
    storage.gate.set()
    outcomes = await asyncio.gather(*calls)
    assert [_offsets(outcome) for outcome in outcomes] == [[1], [2], [3], [4]]
    assert storage.calls == [[1], [2, 3, 4]]
    assert queue.in_flight == 0
    storage.gate.clear()
    alone = asyncio.ensure_future(queue.append(_request(5), 1, 5.0))
    await asyncio.sleep(0)
    assert storage.calls[-1] == [5]  # nothing in flight: at once
    storage.gate.set()
    assert _offsets(await alone) == [5]


def test_a_failed_lone_call_frees_the_small_slot() -> None:
    asyncio.run(_a_failed_lone_call_frees_the_small_slot())


async def _a_failed_lone_call_frees_the_small_slot() -> None:
    storage = FakeStorage()
    queue = AppendQueue(storage.append, asyncio.Semaphore(10), max_in_flight=1, small_in_flight=1)
    storage.fail_with = _rpc_error(grpc.StatusCode.UNAVAILABLE, "down")
    storage.gate.set()
    with pytest.raises(grpc.aio.AioRpcError):
        await queue.append(_request(1), 1, 5.0)
    storage.fail_with = None
    storage.gate.clear()
    batch = asyncio.ensure_future(queue.append(_request(2, 3), 2, 5.0))
    await asyncio.sleep(0)
    lone = asyncio.ensure_future(queue.append(_request(4), 1, 5.0))
    await asyncio.sleep(0)
    assert storage.calls[1:] == [[2, 3], [4]]  # the failed call left no lone one counted
    storage.gate.set()
    await asyncio.gather(batch, lone)


def test_idempotent_and_several_message_groups_wait_for_the_slot() -> None:
    asyncio.run(_idempotent_and_several_message_groups_wait_for_the_slot())


async def _idempotent_and_several_message_groups_wait_for_the_slot() -> None:
    storage = FakeStorage()
    queue = AppendQueue(storage.append, asyncio.Semaphore(10), max_in_flight=1, small_in_flight=4)
    first = asyncio.ensure_future(queue.append(_request(1), 1, 5.0))
    await asyncio.sleep(0)
    runs = append_queue.PRODUCER_RUNS
    idempotent = asyncio.ensure_future(queue.append(_request(2), 1, 5.0, kind=runs))
    await asyncio.sleep(0)
    several = asyncio.ensure_future(queue.append(_request(3, 4), 2, 5.0))
    lone = asyncio.ensure_future(queue.append(_request(5), 1, 5.0))  # others wait: it waits
    await asyncio.sleep(0)
    assert storage.calls == [[1]]
    storage.gate.set()
    await asyncio.gather(first, idempotent, several, lone)
    assert storage.calls == [[1], [2], [3, 4, 5]]
