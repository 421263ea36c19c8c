"""FIFO topics through a real cluster: a message without a message group is refused,
a group is stored as RocketMQ 5's ``__SHARDINGKEY`` and keeps all of its messages on
one queue (in send order), and a NORMAL topic still takes a sharding key as a route
only (nothing stored)."""

from __future__ import annotations

import grpc

from services.gateway.selection import hash_index
from tests._cluster import Cluster
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.format import SHARDING_KEY
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

GROUPS = [f"order-{i}" for i in range(12)]
PER_GROUP = 5


def _create(cluster: Cluster, topic: str, message_type: str) -> None:
    cluster.gateway.stub.CreateTopic(
        pb.CreateTopicRequest(
            topic=topic,
            message_type=message_type,
            read_queue_nums=3,
            write_queue_nums=3,
            broker_names=["broker-a", "broker-b"],
        ),
        timeout=RPC_TIMEOUT_S,
    )


def _produce(cluster: Cluster, messages: list[pb.ProduceMessage]) -> pb.ProduceResponse:
    answer: pb.ProduceResponse = cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=messages), timeout=RPC_TIMEOUT_S
    )
    return answer


def _pull_all(cluster: Cluster, topic: str) -> list[tuple[str, storage_pb.StoredMessage]]:
    """Every stored message with its broker, queue by queue, each in queue order."""
    found: list[tuple[str, storage_pb.StoredMessage]] = []
    for broker in ("broker-a", "broker-b"):
        for queue_id in range(3):
            answer = cluster.gateway.stub.Pull(
                pb.PullRequest(
                    consumer_group="fifo-check",
                    topic=topic,
                    broker_name=broker,
                    queue_id=queue_id,
                    max_messages=1_000,
                ),
                timeout=RPC_TIMEOUT_S,
            )
            found.extend((broker, message) for message in answer.messages)
    return found


def test_a_fifo_topic_refuses_a_message_without_a_group(cluster: Cluster, topic_name: str) -> None:
    _create(cluster, topic_name, "FIFO")
    grouped = pb.ProduceMessage(topic=topic_name, body=b"g", sharding_key="order-1")
    bare = pb.ProduceMessage(topic=topic_name, body=b"bare")
    for messages in (
        [bare],
        [grouped, bare],
        [pb.ProduceMessage(topic=topic_name, body=b"t", tags="T")],
    ):
        index = len(messages) - 1
        expect_error(
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda m=messages: _produce(cluster, m),  # type: ignore[misc]
            f"messages[{index}]: topic {topic_name!r} is FIFO",
            "this message has no message group",
            "sharding_key",
        )
    # A group with a property separator cannot be stored as a property.
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: _produce(
            cluster, [pb.ProduceMessage(topic=topic_name, body=b"x", sharding_key="a\x01b")]
        ),
        "messages[0].sharding_key",
    )


def test_a_group_is_stored_and_keeps_one_queue_in_send_order(
    cluster: Cluster, topic_name: str
) -> None:
    _create(cluster, topic_name, "FIFO")
    for round_ in range(PER_GROUP):  # interleaved groups, one request per round
        messages = [
            pb.ProduceMessage(
                topic=topic_name, body=f"{group}/{round_}".encode(), sharding_key=group
            )
            for group in GROUPS
        ]
        results = _produce(cluster, messages).results
        assert all(r.status == pb.ProduceResult.SEND_OK for r in results)
    wait_until(  # the consume queues are built asynchronously (dispatch)
        lambda: len(_pull_all(cluster, topic_name)) == len(GROUPS) * PER_GROUP,
        "every message pullable",
    )
    stored = _pull_all(cluster, topic_name)
    queues: dict[str, set[tuple[str, int]]] = {}
    seen: dict[str, list[int]] = {}
    for broker, message in stored:
        key, stored_round = message.body.decode().split("/")
        assert message.properties[SHARDING_KEY] == key
        queues.setdefault(key, set()).add((broker, message.queue_id))
        seen.setdefault(key, []).append(int(stored_round))
    assert all(len(found) == 1 for found in queues.values()), queues
    assert all(rounds == list(range(PER_GROUP)) for rounds in seen.values()), seen
    # More than one queue is used (12 groups over 6 queues).
    assert len({queue for found in queues.values() for queue in found}) > 1


def test_a_normal_topic_takes_a_sharding_key_as_a_route_only(
    cluster: Cluster, topic_name: str
) -> None:
    _create(cluster, topic_name, "NORMAL")
    routed = pb.ProduceMessage(topic=topic_name, body=b"n", sharding_key="order-1")
    assert _produce(cluster, [routed]).results[0].status == pb.ProduceResult.SEND_OK
    wait_until(lambda: _pull_all(cluster, topic_name), "the message pullable")
    ((_, stored),) = _pull_all(cluster, topic_name)
    assert SHARDING_KEY not in stored.properties


def test_a_batch_of_groups_sharing_a_queue_is_stored_there_in_send_order(
    cluster: Cluster, topic_name: str
) -> None:
    """Such a batch takes the plain path (one queue, one run: produce_plain.py), with each
    record's group stored as the general path stores it."""
    _create(cluster, topic_name, "FIFO")
    queues = 6  # 3 on each of the two brokers
    groups = [key for key in (f"order-{i}" for i in range(200)) if hash_index(key, queues) == 4]
    groups = groups[:4]
    messages = [
        pb.ProduceMessage(topic=topic_name, body=f"{group}/{n}".encode(), sharding_key=group)
        for n in range(PER_GROUP)
        for group in groups
    ]
    results = _produce(cluster, messages).results
    assert {(r.status, r.broker_name, r.queue_id) for r in results} == {
        (pb.ProduceResult.SEND_OK, "broker-b", 1)  # queue 4 of (a 0..2, b 0..2)
    }
    offsets = [r.queue_offset for r in results]
    assert offsets == list(range(offsets[0], offsets[0] + len(messages)))  # one run, in order
    wait_until(
        lambda: len(_pull_all(cluster, topic_name)) == len(messages), "every message pullable"
    )
    stored = _pull_all(cluster, topic_name)
    assert [message.body for _, message in stored] == [m.body for m in messages]
    assert [message.properties[SHARDING_KEY] for _, message in stored] == [
        m.sharding_key for m in messages
    ]


def expected_queue(key: str, queues_per_broker: int) -> tuple[str, int]:
    """The (broker, queue id) a group hashes to: the writable queues sorted by broker, id."""
    index = hash_index(key, 2 * queues_per_broker)
    if index < queues_per_broker:
        return "broker-a", index
    return "broker-b", index - queues_per_broker


def spread_batch(topic: str, groups: list[str], per_group: int) -> list[pb.ProduceMessage]:
    """Each group's messages interleaved with the others' (round by round), bodies
    ``group/n``: a FIFO producer batching the orders of many customers."""
    return [
        pb.ProduceMessage(topic=topic, body=f"{group}/{n}".encode(), sharding_key=group)
        for n in range(per_group)
        for group in groups
    ]


def per_message(response: pb.ProduceResponse) -> list[tuple[str, int, int, str, str]]:
    """(broker, queue id, queue offset, msg id, error) of each message, in the request's
    order, from per-message results or compact runs alike."""
    if response.results:
        return [
            (r.broker_name, r.queue_id, r.queue_offset, r.msg_id, r.error) for r in response.results
        ]
    found: list[tuple[str, int, int, str, str]] = []
    for run in response.runs:
        assert run.first_index == len(found), "runs in the request's order, none missing"
        for k in range(run.count):
            if run.status == pb.ProduceResult.SEND_FAILED:
                found.append(("", 0, 0, "", run.error))
                continue
            msg_id = f"{run.msg_id_prefix}{run.physical_offsets[k]:016X}"
            found.append((run.broker_name, run.queue_id, run.first_queue_offset + k, msg_id, ""))
    return found


def test_a_batch_of_many_groups_lands_each_on_its_queue_in_order(
    cluster: Cluster, topic_name: str
) -> None:
    """A batch whose groups hash to every queue (the gateway's plain path since issue
    21's FIFO follow-up: split by queue, one run per broker): each message in its group's
    queue with its group stored, each group in order, the answer (per message, then
    compact) in the request's order, and each queue's messages back to back in the
    commitlog (the general path wrote them in the request's order, queues interleaved)."""
    _create(cluster, topic_name, "FIFO")
    groups = [f"customer-{i}" for i in range(24)]
    first = spread_batch(topic_name, groups, PER_GROUP)
    second = spread_batch(topic_name, groups, 2)
    for message in second:
        message.body += b"/again"
    answers = [
        per_message(cluster.gateway.stub.Produce(request, timeout=RPC_TIMEOUT_S))
        for request in (
            pb.ProduceRequest(messages=first),
            pb.ProduceRequest(messages=second, compact_results=True),
        )
    ]
    sent = first + second
    answered = answers[0] + answers[1]
    assert len({(broker, queue) for broker, queue, *_ in answered}) == 6  # every queue
    next_offsets: dict[tuple[str, int], int] = {}
    for message, (broker, queue_id, queue_offset, _, error) in zip(sent, answered, strict=True):
        assert not error
        assert (broker, queue_id) == expected_queue(message.sharding_key, 3)
        expected = next_offsets.get((broker, queue_id), queue_offset)
        assert queue_offset == expected, "each queue's offsets follow the request's order"
        next_offsets[(broker, queue_id)] = queue_offset + 1
    wait_until(lambda: len(_pull_all(cluster, topic_name)) == len(sent), "every message pullable")
    stored = _pull_all(cluster, topic_name)
    msg_ids = {m.body: msg_id for m, (*_, msg_id, _) in zip(sent, answered, strict=True)}
    by_group: dict[str, list[bytes]] = {}
    for broker, record in stored:
        group = record.body.decode().split("/")[0]
        assert record.properties[SHARDING_KEY] == group
        assert (broker, record.queue_id) == expected_queue(group, 3)
        assert record.msg_id == msg_ids[record.body]
        by_group.setdefault(group, []).append(record.body)
    sent_by_group: dict[str, list[bytes]] = {}
    for message in sent:
        sent_by_group.setdefault(message.sharding_key, []).append(message.body)
    assert by_group == sent_by_group  # each group whole, in the order sent
    for request_messages in (first, second):  # one request's messages of a queue: one run
        bodies = {m.body for m in request_messages}
        for (broker, queue_id), run in _queue_runs(stored, bodies).items():
            ends = [m.physical_offset + m.size for m in run[:-1]]
            starts = [m.physical_offset for m in run[1:]]
            assert starts == ends, f"{broker} queue {queue_id}: its records back to back"


def _queue_runs(
    stored: list[tuple[str, storage_pb.StoredMessage]], bodies: set[bytes]
) -> dict[tuple[str, int], list[storage_pb.StoredMessage]]:
    runs: dict[tuple[str, int], list[storage_pb.StoredMessage]] = {}
    for broker, message in stored:
        if message.body in bodies:
            runs.setdefault((broker, message.queue_id), []).append(message)
    return runs
