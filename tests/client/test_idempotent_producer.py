"""IdempotentProducer against a real cluster (docs/client.md "Exactly-once produce"): a
batch resent with the sequences it had is answered with the original results and stored
once, also from a new client with the same producer id; a gap or an old batch is
OUT_OF_RANGE naming the expected sequence; message groups keep their queue on a FIFO
topic; bad idempotent requests are refused."""

from __future__ import annotations

import grpc
import pytest

from tests._cluster import RPC_TIMEOUT_S, Cluster
from tide.client import (
    AlreadyExists,
    FailedPrecondition,
    IdempotentProducer,
    InvalidArgument,
    Message,
    MessageQueue,
    OutOfRange,
    Producer,
    PullConsumer,
    ReceivedMessage,
)
from tide.format import SHARDING_KEY
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until


def batch(topic: str, queue: MessageQueue, count: int, tag: str) -> list[Message]:
    return [Message(topic, f"{tag}-{i}".encode(), queue=queue) for i in range(count)]


def test_a_resent_batch_is_answered_with_its_original_results(cluster: Cluster) -> None:
    topic = "IdemResend"
    cluster.create_topic(topic, queues=2)
    queue = MessageQueue(topic, "broker-a", 1)
    with IdempotentProducer(cluster.gateway.listen) as producer:
        first = producer.send_batch(batch(topic, queue, 3, "a"))
        assert not first.duplicate and first.first_sequence == 0
        again = producer.send_batch(batch(topic, queue, 3, "a"), first_sequence=0)
        assert again.duplicate
        assert [r.msg_id for r in again.results] == [r.msg_id for r in first.results]
        assert [r.queue_offset for r in again.results] == [r.queue_offset for r in first.results]
        assert [r.unique_key for r in again.results] == [r.unique_key for r in first.results]
        # Stored once: the next batch takes the queue offsets right after the first.
        after = producer.send_batch(batch(topic, queue, 2, "b"))
        assert not after.duplicate and after.first_sequence == 3
        assert after.results[0].queue_offset == first.results[-1].queue_offset + 1
        assert producer.next_sequence(queue) == 5


def test_messages_with_tags_keys_and_properties_are_deduplicated_too(
    cluster: Cluster,
) -> None:
    topic = "IdemFields"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    queue = MessageQueue(topic, "broker-a", 0)
    messages = [
        Message(topic, b"f", tags="TagA", keys=["k1"], properties={"n": "1"}, queue=queue),
        Message(topic, b"g", unique_key="0123456789ABCDEF0123456789ABCDEF", queue=queue),
    ]
    with IdempotentProducer(cluster.gateway.listen) as producer:
        first = producer.send_batch(messages)
        again = producer.send_batch(messages, first_sequence=0)
    assert again.duplicate
    assert [r.msg_id for r in again.results] == [r.msg_id for r in first.results]
    assert first.results[1].unique_key == "0123456789ABCDEF0123456789ABCDEF"


def test_a_new_client_with_the_same_id_resends_and_continues(cluster: Cluster) -> None:
    topic = "IdemRestart"
    cluster.create_topic(topic, queues=1, brokers=["broker-b"])
    queue = MessageQueue(topic, "broker-b", 0)
    with IdempotentProducer(cluster.gateway.listen, producer_id="restart-1") as producer:
        sent = producer.send_batch(batch(topic, queue, 4, "x"))
    with IdempotentProducer(cluster.gateway.listen, producer_id="restart-1") as restarted:
        again = restarted.send_batch(batch(topic, queue, 4, "x"), first_sequence=0)
        assert again.duplicate
        assert [r.msg_id for r in again.results] == [r.msg_id for r in sent.results]
    with IdempotentProducer(
        cluster.gateway.listen, producer_id="restart-1", next_sequences={queue: 4}
    ) as resumed:
        more = resumed.send_batch(batch(topic, queue, 1, "y"))
        assert not more.duplicate
        assert more.results[0].queue_offset == sent.results[-1].queue_offset + 1


def test_a_gap_or_an_overlap_is_out_of_range(cluster: Cluster) -> None:
    topic = "IdemGap"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    queue = MessageQueue(topic, "broker-a", 0)
    with IdempotentProducer(cluster.gateway.listen, producer_id="gap-1") as producer:
        producer.send_batch(batch(topic, queue, 3, "a"))
        with pytest.raises(OutOfRange, match="next expected is 3"):
            producer.send_batch(batch(topic, queue, 1, "b"), first_sequence=5)
        with pytest.raises(OutOfRange, match="another size"):
            producer.send_batch(batch(topic, queue, 2, "c"), first_sequence=0)
        assert not producer.send_batch(batch(topic, queue, 1, "d")).duplicate


def test_epochs_start_again_and_fence_and_old_batches_are_already_stored(
    cluster: Cluster,
) -> None:
    topic = "IdemEpoch"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    queue = MessageQueue(topic, "broker-a", 0)
    gateway = cluster.gateway.listen
    with IdempotentProducer(gateway, producer_id="epoch-1", epoch=1) as producer:
        for _ in range(7):  # more batches than the broker's window (5)
            producer.send_batch(batch(topic, queue, 1, "a"))
        with pytest.raises(AlreadyExists, match="stored before, older than the window"):
            producer.send_batch(batch(topic, queue, 1, "a"), first_sequence=0)
    with IdempotentProducer(gateway, producer_id="epoch-1", epoch=2) as newer:
        fresh = newer.send_batch(batch(topic, queue, 2, "b"))
        assert not fresh.duplicate and fresh.first_sequence == 0
        assert fresh.results[0].queue_offset == 7
    with (
        IdempotentProducer(gateway, producer_id="epoch-1", epoch=1) as zombie,
        pytest.raises(FailedPrecondition, match="a newer instance"),
    ):
        zombie.send_batch(batch(topic, queue, 1, "z"), first_sequence=7)


def test_the_queues_of_the_route_are_taken_in_turn(cluster: Cluster) -> None:
    topic = "IdemRoute"
    cluster.create_topic(topic, queues=2)
    with IdempotentProducer(cluster.gateway.listen) as producer:
        queues = {producer.send_batch([Message(topic, b"m")]).queue for _ in range(4)}
        assert len(queues) == 4  # two brokers, two queues each
        assert all(producer.next_sequence(q) == 1 for q in queues)


def test_message_groups_keep_their_queue_on_a_fifo_topic(cluster: Cluster) -> None:
    """A message group (sharding_key) goes to the queue its key hashes to, the one a
    plain producer's sharding key goes to; the FIFO topic's check passes (the group is
    stored as __SHARDINGKEY); a retry is answered with the original results."""
    topic = "IdemFifo"
    cluster.create_topic(topic, queues=2, message_type="FIFO")
    groups = [f"order-{index}" for index in range(8)]
    with (
        IdempotentProducer(cluster.gateway.listen) as producer,
        Producer(cluster.gateway.listen) as plain,
    ):
        sent = {}
        for group in groups:
            messages = [
                Message(topic, f"{group}-{i}".encode(), sharding_key=group) for i in range(3)
            ]
            sent[group] = producer.send_batch(messages)
            assert sent[group].queue == producer.queue_for(topic, group)
            assert plain.send(topic, b"p", sharding_key=group).queue == sent[group].queue, group
        assert len({s.queue for s in sent.values()}) > 1  # the groups spread over queues
        one = producer.send(topic, b"single", sharding_key=groups[0])
        assert one.queue == sent[groups[0]].queue
        retried = producer.send_batch(
            [Message(topic, f"{groups[1]}-{i}".encode(), sharding_key=groups[1]) for i in range(3)],
            first_sequence=sent[groups[1]].first_sequence,
        )
        assert retried.duplicate
        assert [r.msg_id for r in retried.results] == [r.msg_id for r in sent[groups[1]].results]
        with pytest.raises(InvalidArgument, match="no message group"):
            producer.send_batch([Message(topic, b"no group")])
        apart = next(g for g in groups if sent[g].queue != sent[groups[0]].queue)
        with pytest.raises(InvalidArgument, match="hash to several"):
            producer.send_batch(
                [
                    Message(topic, b"a", sharding_key=groups[0]),
                    Message(topic, b"b", sharding_key=apart),
                ]
            )
        with pytest.raises(InvalidArgument, match="none a queue"):
            producer.send_batch(
                [Message(topic, b"a", sharding_key=groups[0]), Message(topic, b"b")]
            )
    queue = sent[groups[2]].queue
    prefix = groups[2].encode()

    def pulled() -> list[ReceivedMessage]:
        with PullConsumer("idem-fifo-check", cluster.gateway.listen) as consumer:
            found = consumer.pull(queue, 0, max_messages=100).messages
        return [m for m in found if m.body.startswith(prefix)]

    wait_until(lambda: len(pulled()) == 3, "the group's messages are dispatched")
    mine = pulled()
    assert [m.body for m in mine] == [f"{groups[2]}-{i}".encode() for i in range(3)]
    assert all(m.properties.get(SHARDING_KEY) == groups[2] for m in mine)


def test_a_sharding_key_on_a_normal_topic_is_only_a_route(cluster: Cluster) -> None:
    """As for a plain producer: the key picks the queue, nothing of it is stored (a
    __SHARDINGKEY property would make the message FIFO, which a NORMAL topic refuses)."""
    topic = "IdemNormalKeyed"
    cluster.create_topic(topic, queues=2)
    with IdempotentProducer(cluster.gateway.listen) as producer:
        sent = producer.send(topic, b"keyed", sharding_key="order-1")
        assert sent.queue == producer.queue_for(topic, "order-1")


def produce_error(cluster: Cluster, request: pb.ProduceRequest) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        cluster.gateway.stub.Produce(request, timeout=RPC_TIMEOUT_S)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT, info.value
    return info.value


def test_bad_idempotent_requests_are_refused(cluster: Cluster) -> None:
    topic = "IdemBad"
    cluster.create_topic(topic, queues=2, message_type="MIXED")
    ref = pb.QueueRef(broker_name="broker-a", queue_id=0)
    other = pb.QueueRef(broker_name="broker-a", queue_id=1)
    cases = [
        (
            pb.ProduceRequest(
                producer_id="p q", messages=[pb.ProduceMessage(topic=topic, body=b"x", queue=ref)]
            ),
            "letters, digits",
        ),
        (
            pb.ProduceRequest(
                producer_id="p", messages=[pb.ProduceMessage(topic=topic, body=b"x")]
            ),
            "names the queue",
        ),
        (
            pb.ProduceRequest(
                producer_id="p",
                messages=[
                    pb.ProduceMessage(topic=topic, body=b"x", queue=ref),
                    pb.ProduceMessage(topic=topic, body=b"y", queue=other),
                ],
            ),
            "one queue",
        ),
        (
            pb.ProduceRequest(
                producer_id="p",
                messages=[pb.ProduceMessage(topic=topic, body=b"x", queue=ref, delay_ms=1000)],
            ),
            "cannot delay",
        ),
        (
            pb.ProduceRequest(
                producer_id="p",
                first_sequence=-1,
                messages=[pb.ProduceMessage(topic=topic, body=b"x", queue=ref)],
            ),
            "negative",
        ),
    ]
    for request, text in cases:
        assert text in (produce_error(cluster, request).details() or "")
    with pytest.raises(InvalidArgument, match="producer_id"):
        IdempotentProducer(cluster.gateway.listen, producer_id="")
