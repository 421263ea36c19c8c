"""tide.v1.Dispatch as a real process following a real storage process over gRPC: every
RPC and its errors, arrivals, health, reflection, a clean stop and restart, waiting for
the storage, and following a storage that restarted or was replaced."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests._service_process import free_port
from tests.services.dispatch.conftest import (
    RPC_TIMEOUT_S,
    DispatchLauncher,
    DispatchProcess,
    Pair,
)
from tests.services.storage.conftest import (
    StorageLauncher,
    cancel,
    expect_error,
    message,
)
from tide.format import UNIQ_KEY, java_string_hashcode, tags_code
from tide.v1 import dispatch_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
OUT_OF_RANGE = grpc.StatusCode.OUT_OF_RANGE


# -- helpers -------------------------------------------------------------------------
def append_dispatched(
    pair: Pair, messages: list[storage_pb.Message]
) -> list[storage_pb.AppendResult]:
    """Append (in batches of 10, the shared storage's limit) and wait until dispatched."""
    results: list[storage_pb.AppendResult] = []
    for start in range(0, len(messages), 10):
        results += pair.storage.append(messages[start : start + 10])
    pair.dispatch.wait_dispatched(pair.storage.status().max_offset)
    return results


def as_entries(results: list[storage_pb.AppendResult], tags: list[str]) -> list[pb.QueueEntry]:
    return [
        pb.QueueEntry(
            queue_offset=r.queue_offset,
            physical_offset=r.physical_offset,
            size=r.size,
            tags_code=tags_code(tag),
        )
        for r, tag in zip(results, tags, strict=True)
    ]


def query(
    dispatch: DispatchProcess, topic: str, key: str, max_count: int = 32, **fields: int
) -> list[pb.IndexHit]:
    request = pb.QueryIndexRequest(topic=topic, key=key, max_count=max_count, **fields)
    return list(dispatch.stub.QueryIndex(request, timeout=RPC_TIMEOUT_S).hits)


def search(dispatch: DispatchProcess, topic: str, timestamp_ms: int, queue_id: int = 0) -> int:
    request = pb.SearchOffsetRequest(topic=topic, queue_id=queue_id, timestamp_ms=timestamp_ms)
    return dispatch.stub.SearchOffset(request, timeout=RPC_TIMEOUT_S).offset


def watch(
    dispatch: DispatchProcess, topics: list[str], *, send_current: bool = True
) -> grpc.CallIterator[pb.ArrivalNotice]:
    request = pb.WatchArrivalsRequest(topics=topics, send_current=send_current)
    return dispatch.stub.WatchArrivals(request, timeout=RPC_TIMEOUT_S)


def next_notice_reaching(
    notices: Iterator[pb.ArrivalNotice], topic: str, queue_id: int, max_offset: int
) -> list[pb.ArrivalNotice]:
    """Read notices until one says (topic, queue_id) reached ``max_offset``."""
    seen: list[pb.ArrivalNotice] = []
    for notice in notices:
        seen.append(notice)
        if (notice.topic, notice.queue_id) == (topic, queue_id) and (
            notice.max_offset >= max_offset
        ):
            return seen
    pytest.fail(f"the watch ended before {topic}/{queue_id} reached {max_offset}: {seen}")


# -- GetQueueEntries, GetQueueOffsets -------------------------------------------------
def test_entries_equal_the_append_results(shared_pair: Pair, topic_name: str) -> None:
    tags = ["A" if i % 3 else "B" for i in range(25)]
    results = append_dispatched(
        shared_pair,
        [message(topic_name, 1, f"m{i}".encode(), tags=t) for i, t in enumerate(tags)],
    )
    response = shared_pair.dispatch.entries(topic_name, 1)
    assert list(response.entries) == as_entries(results, tags)
    assert (response.next_offset, response.min_offset, response.max_offset) == (25, 0, 25)

    # Paging: max_count entries from an offset; next_offset continues.
    page = shared_pair.dispatch.entries(topic_name, 1, offset=7, max_count=5)
    assert list(page.entries) == as_entries(results[7:12], tags[7:12])
    assert page.next_offset == 12

    # At the max offset: nothing new, not an error.
    empty = shared_pair.dispatch.entries(topic_name, 1, offset=25)
    assert not empty.entries
    assert empty.next_offset == 25

    offsets = shared_pair.dispatch.offsets(topic_name, 1)
    assert (offsets.min_offset, offsets.max_offset) == (0, 25)


def test_tag_filter_skips_other_tags_but_advances(shared_pair: Pair, topic_name: str) -> None:
    tags = ["TagA", "TagB", "TagB", "TagC", "TagA", "", "TagB"]
    results = append_dispatched(
        shared_pair, [message(topic_name, 0, tags=t) for t in tags] if tags else []
    )
    code_b = java_string_hashcode("TagB")
    only_b = shared_pair.dispatch.entries(topic_name, tag_codes=(code_b,))
    assert [e.queue_offset for e in only_b.entries] == [1, 2, 6]
    assert list(only_b.entries) == [as_entries(results, tags)[i] for i in (1, 2, 6)]
    assert only_b.next_offset == len(tags)

    # max_count counts the matching entries; next_offset stops after the last one taken.
    two = shared_pair.dispatch.entries(topic_name, max_count=2, tag_codes=(code_b,))
    assert [e.queue_offset for e in two.entries] == [1, 2]
    assert two.next_offset == 3

    a_or_c = shared_pair.dispatch.entries(
        topic_name, offset=1, tag_codes=(tags_code("TagA"), tags_code("TagC"))
    )
    assert [e.queue_offset for e in a_or_c.entries] == [3, 4]
    assert a_or_c.next_offset == len(tags)

    none = shared_pair.dispatch.entries(topic_name, tag_codes=(tags_code("nope"),))
    assert not none.entries
    assert none.next_offset == len(tags)


def test_queue_errors(shared_pair: Pair, topic_name: str) -> None:
    append_dispatched(shared_pair, [message(topic_name, 2) for _ in range(3)])
    dispatch = shared_pair.dispatch
    expect_error(NOT_FOUND, lambda: dispatch.entries(topic_name, 3), f"{topic_name}/3")
    expect_error(NOT_FOUND, lambda: dispatch.entries("NoSuchTopic", 0))
    expect_error(NOT_FOUND, lambda: dispatch.offsets(topic_name, 0))
    expect_error(
        OUT_OF_RANGE,
        lambda: dispatch.entries(topic_name, 2, offset=4),
        "offset 4",
        "min_offset 0",
        "max_offset 3",
    )
    expect_error(OUT_OF_RANGE, lambda: dispatch.entries(topic_name, 2, offset=-1), "max_offset 3")

    def entries_with(max_count: int) -> Callable[[], object]:
        return lambda: dispatch.entries(topic_name, 2, max_count=max_count)

    for bad in (0, -1, 1025):
        expect_error(INVALID, entries_with(bad), "max_count")
    expect_error(INVALID, lambda: dispatch.entries("bad topic", 0), "bad topic")
    expect_error(INVALID, lambda: dispatch.entries(topic_name, -2), "queue_id")
    assert len(dispatch.entries(topic_name, 2, max_count=1024).entries) == 3


# -- SearchOffset -------------------------------------------------------------------
def test_search_offset_by_store_time(shared_pair: Pair, topic_name: str) -> None:
    first = append_dispatched(shared_pair, [message(topic_name, 0) for _ in range(130)])
    first_end = max(r.store_timestamp_ms for r in first)
    # The second batch is stored in a later millisecond (the storage's clock is this one).
    wait_until(lambda: time.time() * 1000 >= first_end + 1, "the clock past the first batch")
    second = append_dispatched(shared_pair, [message(topic_name, 0) for _ in range(170)])
    second_start = min(r.store_timestamp_ms for r in second)
    assert first_end < second_start
    dispatch = shared_pair.dispatch
    boundary = second[0].queue_offset
    assert boundary == 130
    # Any time after the first batch and up to the second batch's first message.
    assert search(dispatch, topic_name, first_end + 1) == boundary
    assert search(dispatch, topic_name, second_start) == boundary
    assert search(dispatch, topic_name, 0) == 0  # before everything: the min offset
    assert search(dispatch, topic_name, first[0].store_timestamp_ms) == 0
    # After everything: the max offset.
    assert search(dispatch, topic_name, second[-1].store_timestamp_ms + 1) == 300
    expect_error(NOT_FOUND, lambda: search(dispatch, topic_name, 0, queue_id=1))


# -- QueryIndex ---------------------------------------------------------------------
def test_query_index_by_key_and_unique_key(shared_pair: Pair, topic_name: str) -> None:
    assert java_string_hashcode(f"{topic_name}#Aa") == java_string_hashcode(f"{topic_name}#BB")
    messages = [
        message(topic_name, 0, b"one", keys=["order-1", "Aa"]),
        message(topic_name, 1, b"two", keys=["BB"]),
        message(topic_name, 2, b"three", keys=["order-1"], properties={UNIQ_KEY: "U-42"}),
        message(topic_name, 3, b"four", keys=["other"]),
    ]
    results = append_dispatched(shared_pair, messages)
    dispatch = shared_pair.dispatch

    def hit(index: int) -> pb.IndexHit:
        r = results[index]
        return pb.IndexHit(
            physical_offset=r.physical_offset,
            size=r.size,
            queue_id=messages[index].queue_id,
            queue_offset=r.queue_offset,
            store_timestamp_ms=r.store_timestamp_ms,
            msg_id=r.msg_id,
        )

    # "Aa" and "BB" share a hash slot and chain: only the real key comes back.
    assert query(dispatch, topic_name, "Aa") == [hit(0)]
    assert query(dispatch, topic_name, "BB") == [hit(1)]
    # Newest first.
    assert query(dispatch, topic_name, "order-1") == [hit(2), hit(0)]
    assert query(dispatch, topic_name, "order-1", max_count=1) == [hit(2)]
    assert query(dispatch, topic_name, "U-42") == [hit(2)]
    assert query(dispatch, topic_name, "missing") == []
    assert query(dispatch, "OtherTopic", "order-1") == []
    # The time range: after every message, nothing.
    later = max(r.store_timestamp_ms for r in results) + 1
    assert query(dispatch, topic_name, "order-1", begin_ms=later) == []
    assert query(dispatch, topic_name, "order-1", end_ms=results[0].store_timestamp_ms - 1) == []

    expect_error(INVALID, lambda: query(dispatch, topic_name, ""), "key")
    expect_error(INVALID, lambda: query(dispatch, topic_name, "k", max_count=0), "max_count")
    expect_error(
        INVALID, lambda: query(dispatch, topic_name, "k", max_count=64 * 1024 + 1), "max_count"
    )
    expect_error(INVALID, lambda: query(dispatch, topic_name, "k", begin_ms=5, end_ms=4))


# -- WatchArrivals ------------------------------------------------------------------
def test_watch_sees_an_append(shared_pair: Pair, topic_name: str) -> None:
    append_dispatched(shared_pair, [message(topic_name, 0)])
    call = watch(shared_pair.dispatch, [topic_name])
    notices = iter(call)
    try:
        # send_current: the queue as it is now (this also proves the watch is registered).
        first = next(notices)
        assert (first.topic, first.queue_id, first.max_offset) == (topic_name, 0, 1)
        shared_pair.storage.append([message(topic_name, 0), message(topic_name, 0)])
        seen = next_notice_reaching(notices, topic_name, 0, 3)
        assert all(n.topic == topic_name for n in seen)
        shared_pair.storage.append([message(topic_name, 1)])
        next_notice_reaching(notices, topic_name, 1, 1)
    finally:
        cancel(call)


def test_watcher_that_does_not_read_gets_the_latest(shared_pair: Pair, topic_name: str) -> None:
    """(Coalescing itself is visible only once HTTP/2 flow control blocks the stream;
    tests/services/dispatch/test_arrivals.py checks it directly.)"""
    other = f"{topic_name}_other"
    append_dispatched(shared_pair, [message(topic_name, 0), message(other, 0)])
    call = watch(shared_pair.dispatch, [topic_name])
    notices = iter(call)
    try:
        assert next(notices).max_offset == 1
        # 40 appends in 40 calls while the watcher reads nothing, plus a topic it does not
        # watch.
        for _ in range(40):
            shared_pair.storage.append([message(topic_name, 0), message(other, 0)])
        shared_pair.dispatch.wait_dispatched(shared_pair.storage.status().max_offset)
        seen = next_notice_reaching(notices, topic_name, 0, 41)
        assert all(n.topic == topic_name for n in seen)
        offsets = [n.max_offset for n in seen]
        assert offsets == sorted(offsets)
        assert len(seen) <= 40
    finally:
        cancel(call)


def test_watch_rejects_bad_topics(shared_pair: Pair) -> None:
    expect_error(
        INVALID, lambda: next(iter(watch(shared_pair.dispatch, ["bad topic"]))), "bad topic"
    )


# -- status, health, reflection -----------------------------------------------------
def test_status(shared_pair: Pair, topic_name: str) -> None:
    append_dispatched(shared_pair, [message(topic_name, 0, keys=["k"])])
    status = shared_pair.dispatch.status()
    storage_status = shared_pair.storage.status()
    assert status.dispatched_offset == storage_status.max_offset
    assert status.storage_max_offset == storage_status.max_offset
    assert status.lag_bytes == 0
    assert status.queue_count >= 1
    assert status.cq_segment_count >= 1
    assert status.index_file_count >= 1
    assert status.index_entry_count >= 1
    assert status.follower_state == "connected"
    assert status.storage == shared_pair.storage.listen
    wait_until(
        lambda: shared_pair.dispatch.status().durable_offset >= storage_status.max_offset,
        "the progress file to catch up",
    )


def test_health_and_reflection(shared_pair: Pair) -> None:
    channel = shared_pair.dispatch.channel
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "tide.v1.Dispatch"):
        response = health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S
        )
        assert response.status == health_pb2.HealthCheckResponse.SERVING, service
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (answer,) = reflection.ServerReflectionInfo(iter([request]), timeout=RPC_TIMEOUT_S)
    names = {s.name for s in answer.list_services_response.service}
    assert "tide.v1.Dispatch" in names


# -- lifecycle ----------------------------------------------------------------------
def test_sigterm_exits_0_and_a_restart_resumes(
    tmp_path: Path, launchers: tuple[StorageLauncher, DispatchLauncher]
) -> None:
    storages, dispatches = launchers
    storage = storages.start(tmp_path / "store")
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen)
    pair = Pair(storage, dispatch)
    first = append_dispatched(pair, [message("Restart", 0, keys=["k1"]) for _ in range(5)])
    dispatch.stop()  # exit status 0

    # Appended while dispatch is down: dispatched after the restart.
    more = storage.append([message("Restart", 0, keys=["k2"]) for _ in range(3)])
    dispatch = dispatches.start(tmp_path / "dispatch", storage.listen)
    pair = Pair(storage, dispatch)
    dispatch.wait_dispatched(storage.status().max_offset)
    entries = dispatch.entries("Restart").entries
    assert [e.physical_offset for e in entries] == [r.physical_offset for r in first + more]
    assert len(query(dispatch, "Restart", "k1")) == 5
    assert len(query(dispatch, "Restart", "k2")) == 3
    dispatch.stop()
    storage.stop()


def test_waits_for_storage_and_follows_it_across_restarts(
    tmp_path: Path, launchers: tuple[StorageLauncher, DispatchLauncher]
) -> None:
    storages, dispatches = launchers
    port = free_port()
    listen = ("--listen", f"127.0.0.1:{port}")
    dispatch = dispatches.spawn(tmp_path / "dispatch", f"127.0.0.1:{port}")
    wait_until(
        lambda: "does not answer GetStatus" in dispatch.stderr(),
        "the dispatch to find no storage",
    )
    assert not dispatch.is_ready()  # health stays NOT_SERVING until the storage answers
    assert dispatch.proc.poll() is None

    storage = storages.start(tmp_path / "store", *listen)
    dispatch.wait_ready()
    pair = Pair(storage, dispatch)
    append_dispatched(pair, [message("Follow", 0) for _ in range(4)])

    # The storage restarts with its data: the follower reconnects and goes on.
    storage.stop()
    storage = storages.start(tmp_path / "store", *listen)
    pair = Pair(storage, dispatch)
    append_dispatched(pair, [message("Follow", 0) for _ in range(2)])
    assert dispatch.offsets("Follow").max_offset == 6

    # A new, empty storage in its place: Tail is OUT_OF_RANGE, so dispatch reconciles
    # (drops what the storage no longer has) and follows it from offset 0.
    storage.stop()
    storage = storages.start(tmp_path / "store2", *listen)
    pair = Pair(storage, dispatch)
    wait_until(lambda: dispatch.status().tail_restarts >= 1, "dispatch to reconcile")
    fresh = append_dispatched(pair, [message("Follow", 0, b"new")])
    assert fresh[0].physical_offset == 0
    entries = dispatch.entries("Follow").entries
    assert [(e.queue_offset, e.physical_offset) for e in entries] == [(0, 0)]
    status = dispatch.status()
    assert "out of range" in status.last_error
    assert status.follower_state == "connected"
    dispatch.stop()
    storage.stop()


def test_bad_options_exit_2(launchers: tuple[StorageLauncher, DispatchLauncher]) -> None:
    _, dispatches = launchers
    for extra in (("--storage", "nope"), ("--cleanup-interval-ms", "0")):
        process = dispatches.spawn(Path("/nonexistent"), "127.0.0.1:1", *extra)
        assert process.wait_exit() == 2, process.describe()
