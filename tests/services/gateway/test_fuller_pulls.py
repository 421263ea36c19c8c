"""A pull's ``min_messages`` and ``min_messages_wait_ms`` (pull.py, long_poll.py): the
gateway holds the pull while its queue has fewer past the offset, answers once there are
that many or when the wait ends; the bounds are refused with a status that names them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from services.gateway.long_poll import HeldPulls
from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tests.services.gateway.test_arrival_answers import held_pull, held_pulls_on, metric
from tests.services.gateway.test_pull_records import decoded, produce, pull
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until_async

Status = pb.PullResponse.Status
RECORDS = pb.PullRequest.ENCODING_RECORDS
HELD_FOR_MIN = "tide_gateway_pulls_held_for_min_messages_total"
# Long enough that a pull answered by it would fail the test's own assertions.
WAIT_MS = 25_000

fuller_cluster = cluster_fixture(
    name="fuller_cluster", brokers=1, gateway_args=("--metrics-listen", "127.0.0.1:0")
)


def bodies(answer: pb.PullResponse) -> list[bytes]:
    return [body for body, *_ in decoded(answer)]


def test_a_pull_is_held_until_min_messages_are_there(fuller_cluster: Cluster) -> None:
    cluster = fuller_cluster
    topic = "T_fuller_held"
    cluster.create_topic(topic, queues=1)
    filled = pull(
        topic, 0, encoding=RECORDS, min_messages=3, min_messages_wait_ms=WAIT_MS, max_messages=8
    )
    waiting = held_pull(cluster, filled)
    # A plain long poll at the same offset answers on the first arrival: once it has, the
    # gateway has seen the notice of one message, and the fuller pull still waits.
    plain = cluster.gateway.stub.Pull.future(
        pull(topic, 0, encoding=RECORDS, long_poll_timeout_ms=WAIT_MS), timeout=WAIT_MS / 1000
    )
    cluster.gateway.wait_held(2)
    produce(cluster, topic, [(b"m0", "")])
    assert bodies(plain.result()) == [b"m0"]
    assert not waiting.done(), waiting.result()
    produce(cluster, topic, [(b"m1", ""), (b"m2", "")])
    answer = waiting.result()
    assert answer.status == Status.FOUND
    assert bodies(answer) == [b"m0", b"m1", b"m2"]
    assert answer.next_offset == 3


def test_the_wait_ends_with_what_there_is(fuller_cluster: Cluster) -> None:
    cluster = fuller_cluster
    topic = "T_fuller_ends"
    cluster.create_topic(topic, queues=1)
    produce(cluster, topic, [(b"only", "")])
    before = metric(cluster, HELD_FOR_MIN)
    wait_ms = 300
    started = time.monotonic()
    answer = cluster.gateway.stub.Pull(
        pull(topic, 0, encoding=RECORDS, min_messages=5, min_messages_wait_ms=wait_ms),
        timeout=RPC_TIMEOUT_S,
    )
    assert time.monotonic() - started >= wait_ms / 1000
    assert answer.status == Status.FOUND and bodies(answer) == [b"only"]
    assert metric(cluster, HELD_FOR_MIN) == before + 1
    # Nothing at all within the wait and no long poll: NO_NEW_MESSAGE at the offset.
    empty = cluster.gateway.stub.Pull(
        pull(topic, 1, min_messages=2, min_messages_wait_ms=100), timeout=RPC_TIMEOUT_S
    )
    assert (empty.status, empty.next_offset) == (Status.NO_NEW_MESSAGE, 1)


def test_enough_messages_are_read_at_once(fuller_cluster: Cluster) -> None:
    cluster = fuller_cluster
    topic = "T_fuller_enough"
    cluster.create_topic(topic, queues=1)
    produce(cluster, topic, [(f"e{i}".encode(), "") for i in range(5)])
    started = time.monotonic()
    answer = cluster.gateway.stub.Pull(
        pull(topic, 0, encoding=RECORDS, min_messages=3, min_messages_wait_ms=WAIT_MS),
        timeout=WAIT_MS / 1000 + RPC_TIMEOUT_S,
    )
    # The gateway may not have a notice for the queue yet (its watch of the dispatch
    # opens with the first wait): its first notice then says there are 5.
    assert time.monotonic() - started < WAIT_MS / 1000 / 2
    assert bodies(answer) == [f"e{i}".encode() for i in range(5)]


def test_a_tag_filter_and_decoded_messages_take_the_same_wait(fuller_cluster: Cluster) -> None:
    """min_messages counts the queue's entries, whatever the expression keeps."""
    cluster = fuller_cluster
    topic = "T_fuller_tags"
    cluster.create_topic(topic, queues=1)
    produce(cluster, topic, [(b"a0", "A"), (b"b0", "B"), (b"a1", "A")])
    answer = cluster.gateway.stub.Pull(
        pull(topic, 0, expression="A", min_messages=3, min_messages_wait_ms=WAIT_MS),
        timeout=WAIT_MS / 1000 + RPC_TIMEOUT_S,
    )
    assert [m.body for m in answer.messages] == [b"a0", b"a1"]
    assert answer.next_offset == 3


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"min_messages": 33}, "min_messages must be in 0..max_messages (32; got 33)"),
        ({"min_messages": 9, "max_messages": 8}, "min_messages must be in 0..max_messages (8"),
        ({"min_messages": -1}, "min_messages must be in 0..max_messages (32; got -1)"),
        (
            {"min_messages": 2, "min_messages_wait_ms": 30_001},
            "min_messages_wait_ms must be in 0..30000 (--max-long-poll-ms; got 30001)",
        ),
        ({"min_messages_wait_ms": -5}, "min_messages_wait_ms must be in 0..30000"),
    ],
)
def test_out_of_bounds_are_refused(
    fuller_cluster: Cluster, fields: dict[str, int], message: str
) -> None:
    cluster = fuller_cluster
    cluster.create_topic("T_fuller_bounds", queues=1)
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: cluster.gateway.stub.Pull(pull("T_fuller_bounds", 0, **fields), timeout=5),
        message,
    )


def _held_pulls(max_held: int) -> HeldPulls:
    """HeldPulls whose dispatch never sends a notice (the test sends them)."""
    never = asyncio.Event()

    async def no_notices(_request: Any) -> Any:
        await never.wait()
        yield  # pragma: no cover

    return held_pulls_on(no_notices, max_held)


def test_wait_filled_wakes_at_the_count_and_goes_on_from_a_notice() -> None:
    key = ("dispatch:1", "T", 0)

    async def scenario() -> tuple[bool, int, int]:
        held = _held_pulls(max_held=10)
        waiting = asyncio.create_task(held.wait_filled(key, 5, 3, 30.0))
        await wait_until_async(lambda: held.held == 1, "the pull to be held", 5.0)
        held.notify(key, 7)  # 2 past the offset: not enough
        await asyncio.sleep(0)
        still_waiting = not waiting.done()
        held.notify(key, 8)
        await asyncio.wait_for(waiting, 5.0)
        counted = held.filled_waits
        # The remembered notice (8) already has 3 past offset 4: no hold.
        await held.wait_filled(key, 4, 3, 30.0)
        await held.stop()
        return still_waiting, counted, held.filled_waits

    still_waiting, counted, after = asyncio.run(scenario())
    assert still_waiting
    assert counted == 1 and after == 1


def test_wait_filled_is_never_refused_at_the_held_limit() -> None:
    """At --max-held-pulls a plain long poll is refused; a min_messages wait reads now."""
    key = ("dispatch:1", "T", 0)

    async def scenario() -> tuple[int, bool]:
        held = _held_pulls(max_held=1)
        plain = asyncio.create_task(held.wait(key, 0, 30.0, held.sequence))
        await wait_until_async(lambda: held.held == 1, "the pull to be held", 5.0)
        await asyncio.wait_for(held.wait_filled(key, 0, 100, 30.0), 5.0)
        counted = held.filled_waits
        await held.stop()
        return counted, await plain

    counted, plain_woken = asyncio.run(scenario())
    assert counted == 0
    assert plain_woken is False  # woken by the stop (closing), not by a notice
