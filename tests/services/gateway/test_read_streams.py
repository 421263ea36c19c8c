"""The gateway's pull calls over ReadStream and GetQueueEntriesStream
(services/gateway/read_streams.py) against real storage and dispatch processes: streams
are reused and bounded, in-band errors raise what the unary calls raise, a stopped server
gives DEADLINE_EXCEEDED, a killed one UNAVAILABLE, and a sampled trace uses the unary
calls."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from services.gateway.brokers import BrokerChannels
from services.gateway.read_streams import READ_STREAMS_PER_ADDRESS
from tests.services.dispatch.conftest import RPC_TIMEOUT_S, DispatchLauncher, Pair
from tests.services.storage.conftest import StorageLauncher, message, rpc_error
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import storage_pb2 as storage_pb

TIMEOUT_S = 1.0


def _pairs(root: Path) -> Iterator[Pair]:
    storages = StorageLauncher(root / "procs")
    dispatches = DispatchLauncher(root / "procs")
    try:
        storage = storages.start(root / "store")
        yield Pair(storage, dispatches.start(root / "dispatch", storage.listen))
    finally:
        dispatches.close()
        storages.close()


@pytest.fixture(scope="module")
def shared_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    yield from _pairs(tmp_path_factory.mktemp("pair"))


@pytest.fixture
def own_pair(tmp_path: Path) -> Iterator[Pair]:
    yield from _pairs(tmp_path)


def entries_request(
    topic: str, offset: int = 0, queue_id: int = 0
) -> dispatch_pb.GetQueueEntriesRequest:
    return dispatch_pb.GetQueueEntriesRequest(
        topic=topic, queue_id=queue_id, offset=offset, max_count=32
    )


def read_request(entries: dispatch_pb.GetQueueEntriesResponse) -> storage_pb.ReadRequest:
    return storage_pb.ReadRequest(
        positions=[
            storage_pb.ReadRequest.Position(physical_offset=e.physical_offset, size=e.size)
            for e in entries.entries
        ]
    )


def fill(pair: Pair, topic: str, count: int) -> None:
    pair.storage.append([message(topic, 0, f"m{i}".encode()) for i in range(count)])
    pair.dispatch.wait_dispatched(pair.storage.status().max_offset)


def streams_logged(log: str, name: str) -> int:
    return sum(
        f"{name} stream from" in line and line.endswith(" opened") for line in log.splitlines()
    )


def test_answers_equal_the_unary_calls_on_few_streams(shared_pair: Pair, topic_name: str) -> None:
    fill(shared_pair, topic_name, 10)
    storage_before = streams_logged(shared_pair.storage.stderr(), "read")
    dispatch_before = streams_logged(shared_pair.dispatch.stderr(), "queue entries")
    asyncio.run(_answers_equal_the_unary_calls(shared_pair, topic_name))
    storage_opened = streams_logged(shared_pair.storage.stderr(), "read") - storage_before
    dispatch_opened = streams_logged(shared_pair.dispatch.stderr(), "queue entries")
    assert 1 <= storage_opened <= READ_STREAMS_PER_ADDRESS
    assert 1 <= dispatch_opened - dispatch_before <= READ_STREAMS_PER_ADDRESS


async def _answers_equal_the_unary_calls(pair: Pair, topic: str) -> None:
    channels = BrokerChannels()
    storage, dispatch = pair.storage.listen, pair.dispatch.listen
    try:
        for offset in range(10):
            entries = await channels.queue_entries(dispatch, entries_request(topic, offset), 1)
            assert entries == pair.dispatch.stub.GetQueueEntries(
                entries_request(topic, offset), timeout=RPC_TIMEOUT_S
            )
            read = await channels.read(storage, read_request(entries), TIMEOUT_S)
            assert read == pair.storage.stub.Read(read_request(entries), timeout=RPC_TIMEOUT_S)
            assert len(read.results) == 10 - offset
        assert _opened(channels, storage, dispatch) == (1, 1)  # one call at a time
        many = await asyncio.gather(
            *(
                channels.queue_entries(dispatch, entries_request(topic), TIMEOUT_S)
                for _ in range(40)
            )
        )
        assert all(len(answer.entries) == 10 for answer in many)
        reads = await asyncio.gather(
            *(channels.read(storage, read_request(many[0]), TIMEOUT_S) for _ in range(40))
        )
        assert all(len(answer.results) == 10 for answer in reads)
        opened_reads, opened_entries = _opened(channels, storage, dispatch)
        assert 1 <= opened_reads <= READ_STREAMS_PER_ADDRESS
        assert 1 <= opened_entries <= READ_STREAMS_PER_ADDRESS
    finally:
        await channels.close()


def _opened(channels: BrokerChannels, storage: str, dispatch: str) -> tuple[int, int]:
    reads, entries = channels.read_streams(storage), channels.entries_streams(dispatch)
    return (reads.opened if reads else 0, entries.opened if entries else 0)


def test_in_band_errors_raise_what_the_unary_calls_raise(
    shared_pair: Pair, topic_name: str
) -> None:
    fill(shared_pair, topic_name, 3)
    asyncio.run(_in_band_errors(shared_pair, topic_name))


async def _in_band_errors(pair: Pair, topic: str) -> None:
    channels = BrokerChannels()
    storage, dispatch = pair.storage.listen, pair.dispatch.listen
    bad_reads = [
        storage_pb.ReadRequest(positions=[storage_pb.ReadRequest.Position(physical_offset=-1)]),
        storage_pb.ReadRequest(
            positions=[storage_pb.ReadRequest.Position(physical_offset=0, size=70 << 20)]
        ),
    ]
    bad_entries = [
        entries_request(topic, queue_id=7),  # NOT_FOUND (gateway: an empty queue)
        entries_request(topic, offset=4),  # OUT_OF_RANGE (gateway: OFFSET_ILLEGAL)
    ]
    try:
        for request in bad_reads:
            await _same_error(
                channels.read(storage, request, TIMEOUT_S),
                partial(pair.storage.stub.Read, request, timeout=RPC_TIMEOUT_S),
            )
        for entries in bad_entries:
            await _same_error(
                channels.queue_entries(dispatch, entries, TIMEOUT_S),
                partial(pair.dispatch.stub.GetQueueEntries, entries, timeout=RPC_TIMEOUT_S),
            )
        answer = await channels.queue_entries(dispatch, entries_request(topic), TIMEOUT_S)
        assert len(answer.entries) == 3
        assert len((await channels.read(storage, read_request(answer), TIMEOUT_S)).results) == 3
        assert _opened(channels, storage, dispatch) == (1, 1)  # the streams went on
    finally:
        await channels.close()


async def _same_error(streamed: Awaitable[object], unary: Callable[[], object]) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await streamed
    expected = rpc_error(unary)
    assert info.value.code() is expected.code()
    assert info.value.details() == expected.details()
    assert info.value.details()


def test_a_sampled_trace_uses_the_unary_calls(shared_pair: Pair, topic_name: str) -> None:
    fill(shared_pair, topic_name, 2)
    asyncio.run(_a_sampled_trace_uses_the_unary_calls(shared_pair, topic_name))


async def _a_sampled_trace_uses_the_unary_calls(pair: Pair, topic: str) -> None:
    span = TracerProvider().get_tracer("test").start_span("pull")
    assert span.is_recording()
    channels = BrokerChannels()
    storage, dispatch = pair.storage.listen, pair.dispatch.listen
    try:
        with trace.use_span(span, end_on_exit=True):
            entries = await channels.queue_entries(dispatch, entries_request(topic), TIMEOUT_S)
            read = await channels.read(storage, read_request(entries), TIMEOUT_S)
        assert len(read.results) == 2
        assert _opened(channels, storage, dispatch) == (0, 0)
    finally:
        await channels.close()


def test_stopped_and_killed_servers(own_pair: Pair, topic_name: str) -> None:
    fill(own_pair, topic_name, 2)
    asyncio.run(_stopped_and_killed(own_pair, topic_name))


async def _stopped_and_killed(pair: Pair, topic: str) -> None:
    channels = BrokerChannels()
    dispatch = pair.dispatch.listen
    try:
        await channels.queue_entries(dispatch, entries_request(topic), TIMEOUT_S)
        pair.dispatch.proc.send_signal(signal.SIGSTOP)
        try:
            await _fails_soon(channels, dispatch, topic, grpc.StatusCode.DEADLINE_EXCEEDED)
        finally:
            pair.dispatch.proc.send_signal(signal.SIGCONT)
        answer = await channels.queue_entries(dispatch, entries_request(topic), TIMEOUT_S)
        assert len(answer.entries) == 2
        assert _opened(channels, pair.storage.listen, dispatch) == (0, 2)  # timed out: dropped
        pair.dispatch.kill()
        for _ in range(3):  # the broken stream, then new ones the address refuses
            await _fails_soon(channels, dispatch, topic, grpc.StatusCode.UNAVAILABLE)
    finally:
        await channels.close()


async def _fails_soon(
    channels: BrokerChannels, address: str, topic: str, code: grpc.StatusCode
) -> None:
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await channels.queue_entries(address, entries_request(topic), TIMEOUT_S)
    assert info.value.code() is code, info.value
    assert time.monotonic() - started < TIMEOUT_S + 1
