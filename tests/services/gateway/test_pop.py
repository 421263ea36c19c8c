"""POP consumption through a real gateway in front of a real broker (issue 20,
docs/pop.md): Receive / Ack, redelivery after the invisible time (through the group's
POP retry topic, attempt + 1, the original's identity kept), dead-lettering past the
group's retry maximum, ChangeInvisibleDuration, bad input, lag, and pull and POP
groups' offsets side by side."""

from __future__ import annotations

import time
import zlib

import grpc

from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.format import RETRY_TOPIC, UNIQ_KEY
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

cluster = cluster_fixture(brokers=1, dispatch_args=("--pop-revive-interval-ms", "100"))
BROKER = "broker-a"
INVISIBLE_MS = 30_000
SHORT_MS = 300  # ChangeInvisibleDuration to this makes a message due again soon


def produce(stub: pb_grpc.GatewayStub, topic: str, count: int, tags: str = "TagA") -> list[str]:
    messages = [
        pb.ProduceMessage(
            topic=topic,
            body=f"m{i}".encode(),
            tags=tags,
            keys=[f"key-{i}"],
            properties={"n": str(i)},
        )
        for i in range(count)
    ]
    reply = stub.Produce(pb.ProduceRequest(messages=messages), timeout=RPC_TIMEOUT_S)
    return [result.msg_id for result in reply.results]


def receive(
    stub: pb_grpc.GatewayStub,
    group: str,
    topic: str,
    max_messages: int = 32,
    *,
    long_poll_ms: int = 0,
    expression: str = "*",
) -> list[pb.ReceivedMessage]:
    reply = stub.Receive(
        pb.ReceiveRequest(
            consumer_group=group,
            topic=topic,
            expression=expression,
            max_messages=max_messages,
            invisible_duration_ms=INVISIBLE_MS,
            long_poll_timeout_ms=long_poll_ms,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    return list(reply.messages)


def ack(stub: pb_grpc.GatewayStub, group: str, topic: str, handles: list[str]) -> pb.AckResponse:
    return stub.Ack(
        pb.AckRequest(
            consumer_group=group,
            topic=topic,
            entries=[pb.AckEntry(receipt_handle=h) for h in handles],
        ),
        timeout=RPC_TIMEOUT_S,
    )


def receive_all(
    stub: pb_grpc.GatewayStub, group: str, topic: str, count: int, max_messages: int = 32
) -> list[pb.ReceivedMessage]:
    """Receive until ``count`` messages came (each Receive may take a part)."""
    got: list[pb.ReceivedMessage] = []
    wait_until(
        lambda: len(got.__iadd__(receive(stub, group, topic, max_messages))) >= count,
        f"{count} messages received",
        state=lambda: len(got),
    )
    return got


def shorten(stub: pb_grpc.GatewayStub, group: str, topic: str, handle: str) -> str:
    reply = stub.ChangeInvisibleDuration(
        pb.ChangeInvisibleDurationRequest(
            consumer_group=group, topic=topic, receipt_handle=handle, invisible_duration_ms=SHORT_MS
        ),
        timeout=RPC_TIMEOUT_S,
    )
    return reply.receipt_handle


def test_receive_then_ack_hands_each_message_out_once(cluster: Cluster) -> None:
    topic, group = "T_pop_basic", "G_pop_basic"
    cluster.create_topic(topic, queues=2)
    ids = produce(cluster.gateway.stub, topic, 10)
    got = receive_all(cluster.gateway.stub, group, topic, 10)
    assert sorted(m.message.msg_id for m in got) == sorted(ids)
    assert all(m.delivery_attempt == 1 and m.broker_name == BROKER for m in got)
    assert all(m.invisible_until_ms > time.time() * 1000 for m in got)
    reply = ack(cluster.gateway.stub, group, topic, [m.receipt_handle for m in got])
    assert [r.error for r in reply.results] == [pb.POP_ERROR_NONE] * 10
    assert receive(cluster.gateway.stub, group, topic) == []
    # A second ack of the same handle: no longer held.
    again = ack(cluster.gateway.stub, group, topic, [got[0].receipt_handle])
    assert again.results[0].error == pb.POP_ERROR_INVALID_RECEIPT_HANDLE
    # Another group gets every message too.
    other = receive_all(cluster.gateway.stub, "G_pop_basic_other", topic, 10)
    assert sorted(m.message.msg_id for m in other) == sorted(ids)


def test_an_unacked_message_is_delivered_again_with_its_identity(cluster: Cluster) -> None:
    topic, group = "T_pop_redeliver", "G_pop_redeliver"
    cluster.create_topic(topic, queues=1)
    (msg_id,) = produce(cluster.gateway.stub, topic, 1)
    (first,) = receive_all(cluster.gateway.stub, group, topic, 1)
    shorten(cluster.gateway.stub, group, topic, first.receipt_handle)
    (second,) = receive_all(cluster.gateway.stub, group, topic, 1)
    assert second.delivery_attempt == 2
    shown = second.message
    assert (shown.topic, shown.msg_id, shown.queue_id, shown.queue_offset) == (
        topic,
        msg_id,
        first.message.queue_id,
        first.message.queue_offset,
    )
    assert shown.body == b"m0" and shown.tags == "TagA" and list(shown.keys) == ["key-0"]
    assert shown.properties["n"] == "0"
    assert shown.properties[UNIQ_KEY] == first.message.properties[UNIQ_KEY]
    assert shown.properties[RETRY_TOPIC] == topic
    # The first handle is spent.
    stale = ack(cluster.gateway.stub, group, topic, [first.receipt_handle])
    assert stale.results[0].error != pb.POP_ERROR_NONE
    assert ack(cluster.gateway.stub, group, topic, [second.receipt_handle]).results[0].error == 0
    assert receive(cluster.gateway.stub, group, topic) == []


def test_past_the_retry_maximum_a_message_goes_to_the_dead_letter_queue(cluster: Cluster) -> None:
    topic, group = "T_pop_dlq", "G_pop_dlq"
    cluster.create_topic(topic, queues=1)
    config = storage_pb.GroupConfig(group_name=group, consume_enable=True, retry_max_times=1)
    cluster.gateway.stub.CreateGroup(pb.CreateGroupRequest(group=config), timeout=RPC_TIMEOUT_S)
    (msg_id,) = produce(cluster.gateway.stub, topic, 1)
    attempts = []
    for _ in range(2):  # retry_max_times 1: two deliveries, then the dead-letter queue
        (got,) = receive_all(cluster.gateway.stub, group, topic, 1)
        attempts.append(got.delivery_attempt)
        shorten(cluster.gateway.stub, group, topic, got.receipt_handle)
    assert attempts == [1, 2]
    dlq = f"%DLQ%{group}"
    wait_until(lambda: _browse(cluster, dlq), f"the dead letter in {dlq}")
    (dead,) = _browse(cluster, dlq)
    assert dead.properties["DLQ_ORIGIN_MESSAGE_ID"] == msg_id
    assert receive(cluster.gateway.stub, group, topic) == []


def _browse(cluster: Cluster, topic: str) -> list[storage_pb.StoredMessage]:
    try:
        reply = cluster.gateway.stub.BrowseQueue(
            pb.PullRequest(topic=topic, broker_name=BROKER, queue_id=0, offset=0, max_messages=8),
            timeout=RPC_TIMEOUT_S,
        )
    except grpc.RpcError:
        return []
    return list(reply.messages)


def test_a_held_receive_is_woken_by_a_produce(cluster: Cluster) -> None:
    topic, group = "T_pop_long_poll", "G_pop_long_poll"
    cluster.create_topic(topic, queues=2)
    future = cluster.gateway.stub.Receive.future(
        pb.ReceiveRequest(
            consumer_group=group,
            topic=topic,
            max_messages=4,
            invisible_duration_ms=INVISIBLE_MS,
            long_poll_timeout_ms=25_000,
        ),
        timeout=60,
    )
    wait_until(lambda: cluster.gateway.held_pulls() >= 1, "the Receive held")
    (msg_id,) = produce(cluster.gateway.stub, topic, 1)
    reply = future.result(timeout=60)
    # A held Receive that timed out answers empty: the message means the arrival woke it.
    assert [m.message.msg_id for m in reply.messages] == [msg_id]


def test_bad_input_is_refused_with_what_to_fix(cluster: Cluster) -> None:
    topic, group = "T_pop_bad", "G_pop_bad"
    cluster.create_topic(topic, queues=1)
    stub = cluster.gateway.stub

    def call_receive(**fields: object) -> object:
        base: dict[str, object] = dict(
            consumer_group=group, topic=topic, max_messages=1, invisible_duration_ms=INVISIBLE_MS
        )
        base.update(fields)
        return stub.Receive(pb.ReceiveRequest(**base), timeout=RPC_TIMEOUT_S)  # type: ignore[arg-type]

    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: call_receive(invisible_duration_ms=1_000),
        "invisible_duration_ms",
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: call_receive(invisible_duration_ms=13 * 3_600_000),
        "invisible_duration_ms",
    )
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: call_receive(topic="T_pop_no_such_topic"))
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: call_receive(consumer_group=""))
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: call_receive(topic="rmq_sys_REVIVE_LOG"),
        "system, retry or dead-letter",
    )
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: call_receive(max_messages=0))
    garbled = ack(stub, group, topic, ["P1.1.0.0.99999999999999.0.broker-a.00000000"])
    assert garbled.results[0].error == pb.POP_ERROR_INVALID_RECEIPT_HANDLE
    assert "garbled" in garbled.results[0].error_message
    expired = "P1.1.0.0.1000.0.broker-a"
    expired += f".{zlib.crc32(expired.encode()):08x}"
    assert (
        ack(stub, group, topic, [expired]).results[0].error == pb.POP_ERROR_RECEIPT_HANDLE_EXPIRED
    )
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: shorten(stub, group, topic, expired),
        "expired",
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: ack(stub, group, topic, ["x"] * 1_025),
        "ACK_ENTRIES_MAX_COUNT",
    )
    (msg,) = (produce(stub, topic, 1), receive_all(stub, group, topic, 1))[1]
    # A handle of this group used with another group: not its handle.
    wrong = ack(stub, "G_pop_bad_other", topic, [msg.receipt_handle])
    assert wrong.results[0].error == pb.POP_ERROR_INVALID_RECEIPT_HANDLE


def test_lag_and_pull_offsets_beside_pop_offsets(cluster: Cluster) -> None:
    topic, group = "T_pop_lag", "G_pop_lag"
    cluster.create_topic(topic, queues=1)
    produce(cluster.gateway.stub, topic, 5)
    cluster.wait_dispatched(topic, 5)
    got = receive(cluster.gateway.stub, group, topic, max_messages=3)
    assert len(got) == 3
    lag = cluster.gateway.stub.GetGroupLag(
        pb.GetGroupLagRequest(consumer_group=group, topic=topic), timeout=RPC_TIMEOUT_S
    )
    assert (lag.ready, lag.inflight) == (2, 3)
    # A pull group on the same topic has its own offset: its lag is every message.
    cluster.gateway.stub.CommitOffset(
        pb.CommitConsumerOffsetRequest(
            consumer_group="G_pop_lag_pull", topic=topic, broker_name=BROKER, queue_id=0, offset=1
        ),
        timeout=RPC_TIMEOUT_S,
    )
    pull_lag = cluster.gateway.stub.GetGroupLag(
        pb.GetGroupLagRequest(consumer_group="G_pop_lag_pull", topic=topic), timeout=RPC_TIMEOUT_S
    )
    assert (pull_lag.ready, pull_lag.inflight) == (4, 0)
    ack(cluster.gateway.stub, group, topic, [m.receipt_handle for m in got])
    lag = cluster.gateway.stub.GetGroupLag(
        pb.GetGroupLagRequest(consumer_group=group, topic=topic), timeout=RPC_TIMEOUT_S
    )
    assert (lag.ready, lag.inflight) == (2, 0)


def test_forward_to_dead_letter_stores_the_message_and_acks_it(cluster: Cluster) -> None:
    topic, group = "T_pop_forward", "G_pop_forward"
    cluster.create_topic(topic, queues=1)
    (msg_id,) = produce(cluster.gateway.stub, topic, 1)
    (got,) = receive_all(cluster.gateway.stub, group, topic, 1)
    reply = cluster.gateway.stub.ForwardToDeadLetter(
        pb.ForwardToDeadLetterRequest(
            consumer_group=group, topic=topic, receipt_handle=got.receipt_handle
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert reply.topic == f"%DLQ%{group}" and reply.msg_id
    wait_until(lambda: _browse(cluster, reply.topic), "the dead letter")
    (dead,) = _browse(cluster, reply.topic)
    assert dead.properties["DLQ_ORIGIN_MESSAGE_ID"] == msg_id
    assert ack(cluster.gateway.stub, group, topic, [got.receipt_handle]).results[0].error != 0


def test_fifo_one_message_group_in_flight_and_redelivery_in_place(cluster: Cluster) -> None:
    """A FIFO topic consumed by an orderly group: the queue's next message only after the
    previous one is acked; one not acked in time comes again at its place (attempt + 1)
    before any later one."""
    topic, group = "T_pop_fifo", "G_pop_fifo"
    cluster.create_topic(topic, queues=1, message_type="FIFO")
    config = storage_pb.GroupConfig(
        group_name=group, consume_enable=True, consume_message_orderly=True, retry_max_times=16
    )
    cluster.gateway.stub.CreateGroup(pb.CreateGroupRequest(group=config), timeout=RPC_TIMEOUT_S)
    stub = cluster.gateway.stub
    messages = [
        pb.ProduceMessage(topic=topic, body=f"o{i}".encode(), sharding_key="order-1")
        for i in range(3)
    ]
    stub.Produce(pb.ProduceRequest(messages=messages), timeout=RPC_TIMEOUT_S)
    cluster.wait_dispatched(topic, 3)
    consumer_a = receive(stub, group, topic, max_messages=1)
    assert [m.message.body for m in consumer_a] == [b"o0"]
    # Consumer B: nothing while o0 is in flight.
    assert receive(stub, group, topic, max_messages=1) == []
    ack(stub, group, topic, [consumer_a[0].receipt_handle])
    (first,) = receive(stub, group, topic, max_messages=1)
    assert (first.message.body, first.delivery_attempt) == (b"o1", 1)
    shorten(stub, group, topic, first.receipt_handle)
    (again,) = receive_all(stub, group, topic, 1, max_messages=1)
    assert (again.message.body, again.delivery_attempt) == (b"o1", 2)
    assert again.message.queue_offset == first.message.queue_offset
    assert again.message.topic == topic  # in place: not through a retry topic
    ack(stub, group, topic, [again.receipt_handle])
    (last,) = receive_all(stub, group, topic, 1, max_messages=1)
    assert last.message.body == b"o2"


def test_a_tag_expression_passes_other_messages_over(cluster: Cluster) -> None:
    topic, group = "T_pop_tags", "G_pop_tags"
    cluster.create_topic(topic, queues=1)
    produce(cluster.gateway.stub, topic, 3, tags="TagA")
    wanted = produce(cluster.gateway.stub, topic, 2, tags="TagB")
    cluster.wait_dispatched(topic, 5)
    got = receive(cluster.gateway.stub, group, topic, expression="TagB || TagC")
    assert sorted(m.message.msg_id for m in got) == sorted(wanted)
    # The TagA messages were passed over for good: the group's offset is past them.
    lag = cluster.gateway.stub.GetGroupLag(
        pb.GetGroupLagRequest(consumer_group=group, topic=topic), timeout=RPC_TIMEOUT_S
    )
    assert (lag.ready, lag.inflight) == (0, 2)
    assert receive(cluster.gateway.stub, group, topic) == []


def test_a_group_that_may_not_consume_is_refused(cluster: Cluster) -> None:
    topic, group = "T_pop_disabled", "G_pop_disabled"
    cluster.create_topic(topic, queues=1)
    config = storage_pb.GroupConfig(group_name=group, consume_enable=False, retry_max_times=-1)
    cluster.gateway.stub.CreateGroup(pb.CreateGroupRequest(group=config), timeout=RPC_TIMEOUT_S)
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: receive(cluster.gateway.stub, group, topic),
        "consume_enable",
    )


def test_change_invisible_duration_out_of_range_is_refused(cluster: Cluster) -> None:
    topic, group = "T_pop_change_bad", "G_pop_change_bad"
    cluster.create_topic(topic, queues=1)
    produce(cluster.gateway.stub, topic, 1)
    (got,) = receive_all(cluster.gateway.stub, group, topic, 1)

    def change(duration: int) -> object:
        return cluster.gateway.stub.ChangeInvisibleDuration(
            pb.ChangeInvisibleDurationRequest(
                consumer_group=group,
                topic=topic,
                receipt_handle=got.receipt_handle,
                invisible_duration_ms=duration,
            ),
            timeout=RPC_TIMEOUT_S,
        )

    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: change(-1), "invisible_duration_ms")
    too_long = 12 * 3_600_000 + 1
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT, lambda: change(too_long), "invisible_duration_ms"
    )
    assert ack(cluster.gateway.stub, group, topic, [got.receipt_handle]).results[0].error == 0


def test_held_receives_past_the_limit_are_refused(cluster: Cluster) -> None:
    """Replaces the gateway (and puts one with the default flags back)."""
    topic, group = "T_pop_held_limit", "G_pop_held_limit"
    cluster.create_topic(topic, queues=1)
    cluster.restart_gateway("--max-held-receives", "0")
    try:
        expect_error(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            lambda: receive(cluster.gateway.stub, group, topic, long_poll_ms=5_000),
            "--max-held-receives",
        )
        assert receive(cluster.gateway.stub, group, topic) == []  # no wait: not held
    finally:
        cluster.restart_gateway()


def test_fifo_past_the_retry_maximum_dead_letters_and_moves_on(cluster: Cluster) -> None:
    topic, group = "T_pop_fifo_dlq", "G_pop_fifo_dlq"
    cluster.create_topic(topic, queues=1, message_type="FIFO")
    config = storage_pb.GroupConfig(
        group_name=group, consume_enable=True, consume_message_orderly=True, retry_max_times=1
    )
    cluster.gateway.stub.CreateGroup(pb.CreateGroupRequest(group=config), timeout=RPC_TIMEOUT_S)
    stub = cluster.gateway.stub
    messages = [pb.ProduceMessage(topic=topic, body=b, sharding_key="k") for b in (b"p0", b"p1")]
    stub.Produce(pb.ProduceRequest(messages=messages), timeout=RPC_TIMEOUT_S)
    cluster.wait_dispatched(topic, 2)
    attempts = []
    for _ in range(2):  # retry_max_times 1: two deliveries in place, then the DLQ
        (got,) = receive_all(stub, group, topic, 1, max_messages=1)
        assert got.message.body == b"p0"
        attempts.append(got.delivery_attempt)
        shorten(stub, group, topic, got.receipt_handle)
    assert attempts == [1, 2]
    (after,) = receive_all(stub, group, topic, 1, max_messages=1)
    assert after.message.body == b"p1"
    (dead,) = _browse(cluster, f"%DLQ%{group}")
    assert dead.body == b"p0"
