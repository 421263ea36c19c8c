"""Delayed produce through a real gateway: the rewrite into SCHEDULE_TOPIC_XXXX, the bytes
stored, the delivery, and the statuses of bad input.

The brokers' dispatches use the table "1s 2s 3s" (--message-delay-level) to keep the tests
short. "No earlier than due" compares store timestamps, never the test's clock.
"""

from __future__ import annotations

import time

import grpc

from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.format import (
    SCHEDULE_TOPIC,
    TIMER_DELIVER_MS,
    TIMER_TOPIC,
    UNIQ_KEY,
    decode_record,
    encode_properties,
    make_msg_id,
    timer_properties,
)
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

cluster = cluster_fixture(
    brokers=1,
    dispatch_args=(
        "--message-delay-level",
        "1s 2s 3s",
        "--delivery-progress-interval-ms",
        "200",
        "--delivery-role-check-interval-ms",
        "200",
    ),
)
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def produce_one(cluster: Cluster, message: pb.ProduceMessage) -> pb.ProduceResult:
    reply = cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=[message]), timeout=RPC_TIMEOUT_S
    )
    (result,) = reply.results
    return result


def query(cluster: Cluster, **query: object) -> list[pb.QueriedMessage]:
    reply = cluster.gateway.stub.QueryMessage(
        pb.QueryMessageRequest(**query),  # type: ignore[arg-type]
        timeout=RPC_TIMEOUT_S,
    )
    return list(reply.messages)


def raw_record(cluster: Cluster, physical_offset: int, size: int) -> bytes:
    storage = cluster.brokers[0].storage
    span = storage_pb.RecordSpan(physical_offset=physical_offset, size=size, count=1)
    response = storage.stub.Read(storage_pb.ReadRequest(spans=[span]), timeout=RPC_TIMEOUT_S)
    return bytes(response.records)


def test_delay_level_is_stored_as_rocketmq_stores_it_and_delivered(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=2, message_type="DELAY")
    sent = pb.ProduceMessage(
        topic=topic_name,
        body=b"later",
        tags="TagA",
        keys=["order-1"],
        properties={"color": "red"},
        queue=pb.QueueRef(broker_name="broker-a", queue_id=1),
        delay_level=2,
    )
    result = produce_one(cluster, sent)
    assert (result.broker_name, result.queue_id) == ("broker-a", 1)  # the real queue

    # What is stored: the schedule topic's queue level - 1, RocketMQ's properties.
    (stored,) = query(cluster, msg_id=result.msg_id)
    message = stored.message
    assert (message.topic, message.queue_id) == (SCHEDULE_TOPIC, 1)
    raw = raw_record(cluster, message.physical_offset, message.size)
    record = decode_record(raw, 0, len(raw))
    assert record.properties == {
        "color": "red",
        "UNIQ_KEY": result.unique_key,
        "TAGS": "TagA",
        "KEYS": "order-1",
        "DELAY": "2",
        "REAL_TOPIC": topic_name,
        "REAL_QID": "1",
    }
    suffix = f"DELAY\x012\x02REAL_TOPIC\x01{topic_name}\x02REAL_QID\x011\x02".encode()
    assert raw.endswith(suffix)
    # Its consume queue entry's tags code is the delivery time (docs/formats.md).
    dispatch = cluster.brokers[0].dispatch
    dispatch.wait_dispatched(message.physical_offset + message.size)
    entries = dispatch.entries(SCHEDULE_TOPIC, 1).entries
    (entry,) = [e for e in entries if e.physical_offset == message.physical_offset]
    assert entry.tags_code == message.store_timestamp_ms + 2000

    # Delivered to the real queue, once, no earlier than due, found by unique key and key.
    cluster.wait_dispatched(topic_name, 1, queue_id=1)
    (copy,) = query(
        cluster, unique_key=pb.UniqueKeyQuery(topic=topic_name, unique_key=result.unique_key)
    )
    delivered = copy.message
    assert (delivered.topic, delivered.queue_id, delivered.body) == (topic_name, 1, b"later")
    assert delivered.store_timestamp_ms >= message.store_timestamp_ms + 2000
    assert delivered.properties["color"] == "red" and delivered.tags == "TagA"
    assert list(delivered.keys) == ["order-1"]
    assert not {"DELAY", "REAL_TOPIC", "REAL_QID"} & set(delivered.properties)
    by_key = query(cluster, key=pb.KeyQuery(topic=topic_name, key="order-1", max_count=10))
    assert [found.message.physical_offset for found in by_key] == [delivered.physical_offset]


def test_a_time_in_the_past_is_delivered_now(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, message_type="DELAY")
    result = produce_one(cluster, pb.ProduceMessage(topic=topic_name, body=b"now", deliver_at_ms=1))
    (stored,) = query(cluster, msg_id=result.msg_id)
    assert (stored.message.topic, stored.message.queue_id) == (topic_name, 0)
    assert result.queue_offset == 0
    assert not any(name.startswith("TIMER_") for name in stored.message.properties)


def test_a_batch_of_timed_bodies_is_stored_as_each_message_alone_would_be(
    cluster: Cluster, topic_name: str
) -> None:
    """The gateway's shorter path for a batch of timed messages with bodies only
    (produce_timed.py): every record is what the general path stores, the properties of
    tide.format.timer_properties in the timer topic, and the answer names the real queue."""
    cluster.create_topic(topic_name, queues=2, message_type="DELAY")
    precision_ms = cluster.brokers[0].dispatch.status().delivery.timer_precision_ms
    start_ms = time.time_ns() // 1_000_000
    at_ms = [start_ms + 3_600_000 + 137 * i for i in range(10)]
    messages = [
        pb.ProduceMessage(topic=topic_name, body=b"b%d" % i, deliver_at_ms=at)
        for i, at in enumerate(at_ms)
    ]
    messages += [
        pb.ProduceMessage(topic=topic_name, body=b"d", delay_ms=600_000 + i) for i in range(5)
    ]
    reply = cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=messages, compact_results=True), timeout=RPC_TIMEOUT_S
    )
    end_ms = time.time_ns() // 1_000_000
    (run,) = reply.runs
    assert run.count == len(messages) and run.status == pb.ProduceResult.SEND_OK
    for index, (sent, key) in enumerate(zip(messages, run.unique_keys, strict=True)):
        msg_id = make_msg_id(run.msg_id_prefix, run.physical_offsets[index])
        (stored,) = query(cluster, msg_id=msg_id)
        message = stored.message
        assert (message.topic, message.queue_id) == (TIMER_TOPIC, 0)
        assert message.queue_offset == run.first_queue_offset + index
        raw = raw_record(cluster, message.physical_offset, message.size)
        record = decode_record(raw, 0, len(raw))
        assert record.body == sent.body
        deliver_ms = sent.deliver_at_ms or int(record.properties[TIMER_DELIVER_MS])
        if sent.delay_ms:  # counted from the gateway's clock during the call
            assert start_ms + sent.delay_ms <= deliver_ms <= end_ms + sent.delay_ms
        expected = timer_properties(
            {UNIQ_KEY: key}, topic_name, run.queue_id, deliver_ms, 0, precision_ms
        )
        assert raw.endswith(encode_properties(expected))
        assert list(record.properties) == list(expected)


def test_bad_delays_are_refused_naming_the_fix(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, message_type="DELAY")

    def produce(**fields: object) -> None:
        message = pb.ProduceMessage(topic=topic_name, body=b"x", **fields)  # type: ignore[arg-type]
        produce_one(cluster, message)

    expect_error(
        INVALID,
        lambda: produce(delay_level=4),
        "messages[0].delay_level 4 is outside the delay level table; give 1 to 3",
        "(messageDelayLevel: 1s 2s 3s)",
    )
    expect_error(
        INVALID,
        lambda: produce(delay_level=1, delay_ms=5000),
        "messages[0]: set one of delay_level, deliver_at_ms, delay_ms (got delay_level, delay_ms)",
    )
    expect_error(INVALID, lambda: produce(delay_ms=-1), "messages[0].delay_ms is -1; must be > 0")
    expect_error(INVALID, lambda: produce(delay_level=-2), "messages[0].delay_level is -2")
    expect_error(
        INVALID,
        lambda: produce(delay_level=1, properties={"TRAN_MSG": "true"}),
        "a transactional message cannot be delayed",
    )
    expect_error(
        INVALID,
        lambda: produce(properties={"DELAY": "3"}),
        "'DELAY' is set by the broker for delayed and timed messages; use the delay_level",
    )
    far_ms = 10 * 24 * 3600 * 1000  # 10 days: past any timer's maximum
    timer = cluster.brokers[0].dispatch.status().delivery.timer_max_delay_ms
    if timer:  # a dispatch with a timer names its maximum
        expect_error(
            INVALID, lambda: produce(delay_ms=far_ms), "the maximum delay is", "timer-max-delay-ms"
        )
    else:
        expect_error(
            grpc.StatusCode.FAILED_PRECONDITION,
            lambda: produce(delay_ms=far_ms),
            "broker broker-a's dispatch runs no timer",
        )


def test_level_pending_is_reported_until_delivered(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, message_type="DELAY")
    dispatch = cluster.brokers[0].dispatch
    before = list(dispatch.status().delivery.delay_level_pending)
    produce_one(cluster, pb.ProduceMessage(topic=topic_name, body=b"x", delay_level=3))
    wait_until(
        lambda: dispatch.status().delivery.delay_level_pending[2] in (before[2] + 1, 0),
        "level 3 to report the message pending",
    )
    cluster.wait_dispatched(topic_name, 1)
    wait_until(lambda: dispatch.status().delivery.delay_level_pending[2] == 0, "level 3 to drain")
