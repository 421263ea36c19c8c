"""A held records pull answered with the entries its arrival notice carried (long_poll.py,
pull.py), and the pulls that still ask the dispatch: a real cluster, the gateway's
``tide_gateway_pulls_answered_from_arrivals_total`` telling which way each went."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import grpc

from services.gateway.long_poll import HeldPulls
from tests._cluster import Cluster, cluster_fixture
from tests._metrics import SCRAPE_INTERVAL_S, scrape, total
from tests.services.gateway.conftest import RPC_TIMEOUT_S
from tests.services.gateway.test_pull_records import decoded, produce, pull
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until, wait_until_async

Status = pb.PullResponse.Status
RECORDS = pb.PullRequest.ENCODING_RECORDS
ANSWERED = "tide_gateway_pulls_answered_from_arrivals_total"
HELD = "tide_gateway_held_pulls"
LONG_POLL_MS = 20_000

METRICS = ("--metrics-listen", "127.0.0.1:0")
arrivals_cluster = cluster_fixture(
    name="arrivals_cluster", brokers=1, gateway_args=METRICS, dispatch_args=METRICS
)


def metric(cluster: Cluster, name: str) -> float:
    return total(scrape(cluster.gateway.ready["metrics"]), name)


def dispatch_reads(cluster: Cluster) -> float:
    """GetQueueEntries calls with records the dispatch answered (tail cache hits and
    misses: the notices' entries are not counted)."""
    scraped = scrape(str(cluster.brokers[0].dispatch.ready["metrics"]))
    return total(scraped, "tide_dispatch_tail_cache_hits_total") + total(
        scraped, "tide_dispatch_tail_cache_misses_total"
    )


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


def test_pulls_that_find_records_are_answered_from_kept_entries(
    arrivals_cluster: Cluster,
) -> None:
    """A held pull taking fewer records than the notice carried, then the pulls that find
    the rest (not held): answered from the entries the gateway kept, exactly as the
    dispatch answers them; a pull from an older offset asks the dispatch."""
    cluster = arrivals_cluster
    topic = "T_arrivals_kept"
    cluster.create_topic(topic, queues=1)
    arrive(cluster, topic, 0, [b"warm"], encoding=RECORDS)  # the watch is open now
    before = metric(cluster, ANSWERED)
    bodies = [f"k{i}".encode() * (i + 1) for i in range(5)]
    first = arrive(cluster, topic, 1, bodies, encoding=RECORDS, max_messages=2)
    got = [(body, queue_offset) for body, _, queue_offset, _, _ in decoded(first)]
    offset = first.next_offset
    while offset < 6:  # the notice that woke the first pull came: the rest is kept
        answer = cluster.gateway.stub.Pull(
            pull(topic, offset, encoding=RECORDS, max_messages=2), timeout=RPC_TIMEOUT_S
        )
        assert answer.status == Status.FOUND and answer.max_offset == 6
        got += [(body, queue_offset) for body, _, queue_offset, _, _ in decoded(answer)]
        offset = answer.next_offset
    assert got == [(body, 1 + i) for i, body in enumerate(bodies)]
    assert metric(cluster, ANSWERED) == before + 3  # the held pull and the two after it
    asked = cluster.gateway.stub.Pull(
        pull(topic, 0, encoding=RECORDS, max_messages=3), timeout=RPC_TIMEOUT_S
    )
    assert [body for body, *_ in decoded(asked)] == [b"warm", *bodies[:2]]
    assert metric(cluster, ANSWERED) == before + 3


def test_a_pull_after_a_small_notice_does_not_ask_the_dispatch(
    arrivals_cluster: Cluster,
) -> None:
    """A consumer that keeps up (its last read found nothing new) pulls after a single
    message arrived, nobody held: the small notice carried the record and the gateway
    answers from it; the dispatch answers no GetQueueEntries for it."""
    cluster = arrivals_cluster
    topic = "T_arrivals_small"
    cluster.create_topic(topic, queues=2)
    arrive(cluster, topic, 0, [b"warm"], encoding=RECORDS)  # caught up at 0; watch open
    produce(cluster, topic, [(b"small", "B")])  # offset 1: no pull held
    # Notices come in order on one watch: once a pull held on queue 1 is woken, the
    # gateway has taken in queue 0's notice.
    other = pb.PullRequest(
        topic=topic, broker_name="broker-a", queue_id=1, long_poll_timeout_ms=LONG_POLL_MS
    )
    woken = held_pull(cluster, other)
    queue_1 = pb.QueueRef(broker_name="broker-a", queue_id=1)
    message = pb.ProduceMessage(topic=topic, body=b"q1", queue=queue_1)
    cluster.gateway.stub.Produce(pb.ProduceRequest(messages=[message]), timeout=RPC_TIMEOUT_S)
    assert [m.body for m in woken.result().messages] == [b"q1"]
    reads, answered = dispatch_reads(cluster), metric(cluster, ANSWERED)
    answer = cluster.gateway.stub.Pull(pull(topic, 1, encoding=RECORDS), timeout=RPC_TIMEOUT_S)
    assert answer.status == Status.FOUND and answer.next_offset == answer.max_offset == 2
    assert [(body, offset) for body, _, offset, _, _ in decoded(answer)] == [(b"small", 1)]
    assert metric(cluster, ANSWERED) == answered + 1
    assert dispatch_reads(cluster) == reads
    # From an offset the notices did not bring: asked.
    again = cluster.gateway.stub.Pull(pull(topic, 0, encoding=RECORDS), timeout=RPC_TIMEOUT_S)
    assert [body for body, *_ in decoded(again)] == [b"warm", b"small"]
    assert dispatch_reads(cluster) == reads + 1


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


def test_a_notice_for_another_offset_is_not_used() -> None:
    """HeldPulls hands a woken pull the notice's entries only when they start at the
    pull's own offset (a notice's entries start where the previous notice ended)."""

    async def scenario() -> list[tuple[bool, dispatch_pb.GetQueueEntriesResponse | None]]:
        never = asyncio.Event()

        async def no_notices(_request: Any) -> Any:
            await never.wait()
            yield  # pragma: no cover

        channels = SimpleNamespace(
            dispatch=lambda _address: SimpleNamespace(WatchArrivals=no_notices)
        )
        held = HeldPulls(
            cast(Any, channels),
            max_held=10,
            recheck_interval_s=60,
            rpc_timeout_s=1,
            notice_max_bytes=1 << 20,
        )
        key = ("dispatch:1", "T", 0)
        entries = dispatch_pb.GetQueueEntriesResponse(next_offset=7, records=b"r")
        results = []
        for pull_offset, notice in (
            (5, dispatch_pb.ArrivalNotice(max_offset=7, entries_offset=5, entries=entries)),
            (6, dispatch_pb.ArrivalNotice(max_offset=7, entries_offset=5, entries=entries)),
            (5, dispatch_pb.ArrivalNotice(max_offset=7, entries_offset=5)),
            (5, None),
        ):
            waiting = asyncio.create_task(held.wait(key, pull_offset, 5.0, held.sequence))
            await wait_until_async(lambda: held.held == 1, "the pull to be held", 5.0)
            held.notify(key, 7, notice)
            results.append(await waiting)
        results.append(await held.wait(key, 7, 0.05, held.sequence))  # times out
        await held.stop()
        return results

    found, other_offset, no_entries, recheck, timed_out = asyncio.run(scenario())
    assert found[0] is True and found[1] is not None and found[1].next_offset == 7
    assert other_offset == (True, None)
    assert no_entries == (True, None)
    assert recheck == (True, None)
    assert timed_out == (False, None)
