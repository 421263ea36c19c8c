"""A held records pull answered with the entries its arrival notice carried (long_poll.py,
pull.py), and the pulls that still ask the dispatch: a real cluster, the gateway's
``tide_gateway_pulls_answered_from_arrivals_total`` telling which way each went."""

from __future__ import annotations

import asyncio
import struct
from types import SimpleNamespace
from typing import Any, cast

import grpc

from services.gateway.arrived import ArrivedRecords
from services.gateway.long_poll import HeldPulls
from tests._cluster import Cluster, cluster_fixture
from tests._metrics import SCRAPE_INTERVAL_S, scrape, total
from tests.services.gateway.conftest import RPC_TIMEOUT_S
from tests.services.gateway.test_pull_records import decoded, produce, pull
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until, wait_until_async

Status = pb.PullResponse.Status
RECORDS = pb.PullRequest.ENCODING_RECORDS
ANSWERED = "tide_gateway_pulls_answered_from_arrivals_total"
HELD = "tide_gateway_held_pulls"
LONG_POLL_MS = 20_000

arrivals_cluster = cluster_fixture(
    name="arrivals_cluster", brokers=1, gateway_args=("--metrics-listen", "127.0.0.1:0")
)


def metric(cluster: Cluster, name: str) -> float:
    return total(scrape(cluster.gateway.ready["metrics"]), name)


def wait_for_metric(cluster: Cluster, name: str, done: Any, what: str) -> None:
    """Until ``done(value)`` (the gauges are sampled every second)."""
    wait_until(
        lambda: done(metric(cluster, name)),
        what,
        interval_s=SCRAPE_INTERVAL_S,
        state=lambda: f"{name} = {metric(cluster, name)}",
    )


def held_pull(cluster: Cluster, request: pb.PullRequest) -> grpc.Future[pb.PullResponse]:
    """Start ``request`` as a long poll (no other is held) and wait until it is held."""
    wait_for_metric(cluster, HELD, lambda held: held == 0, "an earlier pull is still held")
    future = cluster.gateway.stub.Pull.future(request, timeout=LONG_POLL_MS / 1000 + 10)
    wait_for_metric(cluster, HELD, lambda held: held >= 1 or future.done(), "not held")
    assert not future.done(), future.result()
    return future


def arrive(
    cluster: Cluster, topic: str, offset: int, bodies: list[bytes], **fields: Any
) -> pb.PullResponse:
    """Hold a pull at ``offset`` (the queue's end), produce ``bodies``: its answer."""
    request = pull(topic, offset, long_poll_timeout_ms=LONG_POLL_MS, **fields)
    future = held_pull(cluster, request)
    produce(cluster, topic, [(body, "A" if b"a" in body else "B") for body in bodies])
    return future.result()


def test_held_records_pulls_are_answered_from_the_notice(arrivals_cluster: Cluster) -> None:
    cluster = arrivals_cluster
    topic = "T_arrivals_answer"
    cluster.create_topic(topic, queues=1)
    # The first arrival opens the gateway's watch of the dispatch: its notice may come
    # before the watch has announced the queue, then the pull asks as before.
    first = arrive(cluster, topic, 0, [b"first"], encoding=RECORDS)
    assert [body for body, *_ in decoded(first)] == [b"first"]
    offset = 1
    for round_ in range(3):
        before = metric(cluster, ANSWERED)
        bodies = [f"r{round_}-{i}".encode() for i in range(round_ + 1)]
        answer = arrive(cluster, topic, offset, bodies, encoding=RECORDS, max_messages=32)
        assert answer.status == Status.FOUND
        assert [(body, queue_offset) for body, _, queue_offset, _, _ in decoded(answer)] == [
            (body, offset + i) for i, body in enumerate(bodies)
        ]
        assert answer.next_offset == offset + len(bodies) == answer.max_offset
        assert metric(cluster, ANSWERED) == before + 1
        offset = answer.next_offset
    # What a pull from the same offset answers (records from the tail cache or storage).
    again = cluster.gateway.stub.Pull(pull(topic, 1, encoding=RECORDS), timeout=RPC_TIMEOUT_S)
    assert [b for b, *_ in decoded(again)] == [b"r0-0", b"r1-0", b"r1-1", b"r2-0", b"r2-1", b"r2-2"]


def test_pulls_the_notices_passed_are_answered_from_their_records(
    arrivals_cluster: Cluster,
) -> None:
    """Fewer messages wanted than arrived, then a pull from where that answer ended (the
    notice passed it: not held, not read): both from the notice's records, byte for byte
    what the dispatch answers a pull of the same tag (every message has it)."""
    cluster = arrivals_cluster
    topic = "T_arrivals_after"
    cluster.create_topic(topic, queues=1)
    arrive(cluster, topic, 0, [b"a-warm"], encoding=RECORDS)  # the watch is open now
    before = metric(cluster, ANSWERED)
    bodies = [f"a{i}".encode() for i in range(5)]
    fewer = arrive(cluster, topic, 1, bodies, encoding=RECORDS, max_messages=2)
    assert [body for body, *_ in decoded(fewer)] == bodies[:2]
    assert (fewer.next_offset, fewer.max_offset) == (3, 6)
    rest = cluster.gateway.stub.Pull(
        pull(topic, 3, encoding=RECORDS, long_poll_timeout_ms=LONG_POLL_MS),
        timeout=RPC_TIMEOUT_S,
    )
    assert [body for body, *_ in decoded(rest)] == bodies[2:]
    assert metric(cluster, ANSWERED) == before + 2
    # The same pulls with a tag expression ask the dispatch: the same answers.
    for answer, offset, count in ((fewer, 1, 2), (rest, 3, 32)):
        read = cluster.gateway.stub.Pull(
            pull(topic, offset, encoding=RECORDS, max_messages=count, expression="A"),
            timeout=RPC_TIMEOUT_S,
        )
        assert read.records == answer.records
        assert (read.status, read.next_offset, read.max_offset, read.record_count) == (
            answer.status,
            answer.next_offset,
            answer.max_offset,
            answer.record_count,
        )
    assert metric(cluster, ANSWERED) == before + 2


def test_other_held_pulls_ask_the_dispatch(arrivals_cluster: Cluster) -> None:
    """A tag expression, decoded messages: answered correctly, through GetQueueEntries
    as before (the counter does not move)."""
    cluster = arrivals_cluster
    topic = "T_arrivals_ask"
    cluster.create_topic(topic, queues=1)
    arrive(cluster, topic, 0, [b"warm"], encoding=RECORDS)  # the watch is open now
    before = metric(cluster, ANSWERED)
    tagged = arrive(cluster, topic, 1, [b"a1", b"b4", b"a2"], encoding=RECORDS, expression="A")
    assert [(body, tag) for body, *_, tag in decoded(tagged)] == [(b"a1", "A"), (b"a2", "A")]
    assert tagged.next_offset == 4
    messages = arrive(cluster, topic, 4, [b"b5", b"a3"])
    assert [m.body for m in messages.messages] == [b"b5", b"a3"]
    assert not messages.records
    assert metric(cluster, ANSWERED) == before


HELD_AT_END = "tide_gateway_pulls_held_at_end_total"


def held_pulls_on(watch: Any, max_held: int, arrived_bytes: int = 1 << 20) -> HeldPulls:
    """HeldPulls whose dispatches' ``WatchArrivals`` is the async generator ``watch``."""
    channels = SimpleNamespace(dispatch=lambda _address: SimpleNamespace(WatchArrivals=watch))
    return HeldPulls(
        cast(Any, channels),
        max_held=max_held,
        recheck_interval_s=60,
        rpc_timeout_s=1,
        notice_max_bytes=1 << 20,
        arrived=ArrivedRecords(max_bytes=arrived_bytes, queue_max_bytes=arrived_bytes),
    )


def _held_after_one_notice(max_offset: int, max_held: int) -> tuple[HeldPulls, asyncio.Event]:
    """HeldPulls whose dispatch's arrival stream announces queue ("T", 0) at
    ``max_offset`` once its watch opens, then stays open until the event is set."""
    end_stream = asyncio.Event()

    async def one_notice(_request: Any) -> Any:
        yield dispatch_pb.ArrivalNotice(topic="T", queue_id=0, max_offset=max_offset)
        await end_stream.wait()

    return held_pulls_on(one_notice, max_held), end_stream


def test_a_pull_at_the_announced_end_is_held_before_reading(arrivals_cluster: Cluster) -> None:
    """A records pull at the max offset the open watch announced is held without asking
    the dispatch and answered from the next notice's records; a pull behind the end, or
    with a tag expression, reads first as before."""
    cluster = arrivals_cluster
    topic = "T_arrivals_held_at_end"
    cluster.create_topic(topic, queues=1)
    arrive(cluster, topic, 0, [b"warm"], encoding=RECORDS)  # the watch announced 1
    held_before, answered_before = metric(cluster, HELD_AT_END), metric(cluster, ANSWERED)
    offset = 1
    for round_ in range(3):
        answer = arrive(cluster, topic, offset, [f"at-end-{round_}".encode()], encoding=RECORDS)
        assert [body for body, *_ in decoded(answer)] == [f"at-end-{round_}".encode()]
        assert answer.next_offset == offset + 1
        offset = answer.next_offset
    assert metric(cluster, HELD_AT_END) == held_before + 3
    assert metric(cluster, ANSWERED) == answered_before + 3
    # Behind the end: the read answers at once, nothing held.
    behind = cluster.gateway.stub.Pull(
        pull(topic, 1, encoding=RECORDS, long_poll_timeout_ms=LONG_POLL_MS),
        timeout=RPC_TIMEOUT_S,
    )
    assert [body for body, *_ in decoded(behind)][:1] == [b"at-end-0"]
    # A tag expression: it reads first and is held as before (then answered by the read).
    tagged = arrive(cluster, topic, offset, [b"a-tagged"], encoding=RECORDS, expression="A")
    assert [body for body, *_ in decoded(tagged)] == [b"a-tagged"]
    assert metric(cluster, HELD_AT_END) == held_before + 3


def test_a_pull_is_held_before_reading_only_on_an_open_streams_word() -> None:
    """HeldPulls.hold_at_end: only at the max offset the open stream announced for the
    queue, not before the stream said it nor after it ended, nor past --max-held-pulls."""

    async def scenario() -> None:
        held, end_stream = _held_after_one_notice(5, max_held=1)
        key = ("dispatch:1", "T", 0)
        assert await held.hold_at_end(key, 5, 1.0) is None  # no stream yet
        held._ensure_watch("dispatch:1")
        await wait_until_async(
            lambda: held._announced.get(key) == 5, "the stream to announce the queue", 5.0
        )
        assert await held.hold_at_end(key, 4, 1.0) is None  # behind the end: read
        assert await held.hold_at_end(("dispatch:1", "T", 1), 5, 1.0) is None  # not said
        waiting = asyncio.create_task(held.hold_at_end(key, 5, 5.0))
        await wait_until_async(lambda: held.held == 1, "the pull to be held", 5.0)
        assert held.end_waits == 1
        assert await held.hold_at_end(key, 5, 1.0) is None  # --max-held-pulls (1) held
        held.notify(key, 6)
        assert await waiting is True
        end_stream.set()  # the stream ends: its word no longer holds
        await wait_until_async(lambda: key not in held._announced, "the word forgotten", 5.0)
        assert await held.hold_at_end(key, 5, 1.0) is None
        await held.stop()

    asyncio.run(scenario())


def test_a_queue_that_shrank_wakes_its_held_pulls() -> None:
    """A max offset below the last known (a dispatch that rebuilt the queue shorter)
    wakes every pull held on the queue, past the new end or not, and forgets its
    announced end: they read again and answer where they stand, not at their timeouts."""

    async def scenario() -> None:
        held, end_stream = _held_after_one_notice(10, max_held=10)
        key = ("dispatch:1", "T", 0)
        held._ensure_watch("dispatch:1")
        await wait_until_async(lambda: held._announced.get(key) == 10, "announced", 5.0)
        at_end = asyncio.create_task(held.hold_at_end(key, 10, 30.0))
        past = asyncio.create_task(held.wait(key, 12, 30.0, held.sequence))
        await wait_until_async(lambda: held.held == 2, "both pulls held", 5.0)
        held.notify(key, 11)  # grew: the pull at 10 wakes, the one at 12 does not
        assert await at_end is True
        assert not past.done()
        held.notify(key, 4)  # a recheck finds it shorter than it was
        assert await past is True
        assert await held.hold_at_end(key, 10, 1.0) is None  # its announced end forgotten
        end_stream.set()
        await held.stop()

    asyncio.run(scenario())


def test_the_arrived_records_go_with_their_stream_and_with_a_shrunk_queue() -> None:
    """HeldPulls keeps the records its stream's notices carry (before a pull they woke
    looks); forgets a queue whose notice says it is shorter than it was, and every queue
    of the stream once it ends."""
    record = struct.pack(">i", 8) + b"rec!"
    entries = dispatch_pb.GetQueueEntriesResponse(
        next_offset=6,
        max_offset=6,
        spans=[storage_pb.RecordSpan(size=len(record), count=1)],
        records=record,
    )
    step = asyncio.Event()
    end_stream = asyncio.Event()

    async def notices(_request: Any) -> Any:
        for queue_id in (0, 1):
            yield dispatch_pb.ArrivalNotice(topic="T", queue_id=queue_id, max_offset=5)
            yield dispatch_pb.ArrivalNotice(
                topic="T", queue_id=queue_id, max_offset=6, entries_offset=5, entries=entries
            )
        await step.wait()
        yield dispatch_pb.ArrivalNotice(topic="T", queue_id=0, max_offset=2)  # shrank
        await end_stream.wait()

    async def scenario() -> None:
        held = held_pulls_on(notices, max_held=10)
        queue0, queue1 = ("dispatch:1", "T", 0), ("dispatch:1", "T", 1)
        held._ensure_watch("dispatch:1")
        await wait_until_async(lambda: held._announced.get(queue1) == 6, "announced", 5.0)
        for key in (queue0, queue1):
            answer = held.arrived_answer(key, 5, 32, 1 << 20)
            assert answer is not None and answer.records == record
        step.set()
        await wait_until_async(lambda: held._announced.get(queue0) == 2, "shrunk", 5.0)
        assert held.arrived_answer(queue0, 5, 32, 1 << 20) is None
        assert held.arrived_answer(queue1, 5, 32, 1 << 20) is not None
        end_stream.set()
        await wait_until_async(lambda: held.arrived.size_bytes == 0, "forgotten", 5.0)
        await held.stop()

    asyncio.run(scenario())
