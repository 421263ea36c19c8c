"""Topic message types and system topics through a real cluster: CreateTopic's
message_type in the routes (MIXED when brokers disagree), the produce check (RocketMQ 5's
topic message type validator) and its option, the delay / transaction conflict, and the
refusal of system, retry and dead-letter topics to ordinary producers."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.v1 import gateway_pb2 as pb
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import storage_pb2 as storage_pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT

cluster = cluster_fixture(brokers=2)


def create(cluster: Cluster, topic: str, message_type: str, brokers: list[str]) -> None:
    cluster.gateway.stub.CreateTopic(
        pb.CreateTopicRequest(topic=topic, message_type=message_type, broker_names=brokers),
        timeout=RPC_TIMEOUT_S,
    )


def route(cluster: Cluster, topic: str) -> ns_pb.TopicRoute:
    answer: ns_pb.TopicRoute = cluster.gateway.stub.GetTopicRoute(
        ns_pb.GetTopicRouteRequest(topic=topic), timeout=RPC_TIMEOUT_S
    )
    return answer


def produce(cluster: Cluster, *messages: pb.ProduceMessage) -> pb.ProduceResponse:
    answer: pb.ProduceResponse = cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=list(messages)), timeout=RPC_TIMEOUT_S
    )
    return answer


@pytest.fixture(scope="module")
def typed_topics(cluster: Cluster) -> Iterator[dict[str, str]]:
    """One topic of each type on both brokers."""
    topics = {kind: f"T_types_{kind}" for kind in ("NORMAL", "FIFO", "DELAY", "MIXED")}
    for kind, topic in topics.items():
        create(cluster, topic, "" if kind == "NORMAL" else kind, [])
    yield topics


def test_routes_carry_the_type_and_mixed_when_brokers_disagree(cluster: Cluster) -> None:
    topic = "T_types_disagree"
    create(cluster, topic, "FIFO", ["broker-a"])
    assert route(cluster, topic).message_type == "FIFO"
    create(cluster, topic, "DELAY", ["broker-b"])
    answer = route(cluster, topic)
    assert {q.broker_name: q.message_type for q in answer.queue_datas} == {
        "broker-a": "FIFO",
        "broker-b": "DELAY",
    }
    assert answer.message_type == "MIXED"
    listed = cluster.gateway.stub.ListTopics(ns_pb.ListRouteTopicsRequest(), timeout=RPC_TIMEOUT_S)
    assert dict(zip(listed.topics, listed.message_types, strict=True))[topic] == "MIXED"
    # Back to NORMAL everywhere: an empty message_type clears the attribute.
    create(cluster, topic, "", [])
    assert route(cluster, topic).message_type == "NORMAL"


def test_create_topic_refuses_an_unknown_type(cluster: Cluster) -> None:
    for bad in ("LIFO", "UNSPECIFIED", "fifo"):
        expect_error(
            INVALID,
            lambda bad=bad: create(cluster, "T_types_bad", bad, []),  # type: ignore[misc]
            "message_type",
            "NORMAL, FIFO, DELAY, TRANSACTION, MIXED",
        )


def test_a_message_must_match_its_topic_type(
    cluster: Cluster, typed_topics: dict[str, str]
) -> None:
    normal, fifo, delay, mixed = (typed_topics[k] for k in ("NORMAL", "FIFO", "DELAY", "MIXED"))
    plain = pb.ProduceMessage(topic=normal, body=b"n")
    assert produce(cluster, plain).results[0].status == pb.ProduceResult.SEND_OK
    # A delayed message to a NORMAL topic (RocketMQ's properties for it are refused
    # before: the fields are the way, test_scheduled.py).
    for delayed in (
        pb.ProduceMessage(topic=normal, body=b"d", delay_level=3),
        pb.ProduceMessage(topic=normal, body=b"d", deliver_at_ms=1),
        pb.ProduceMessage(topic=normal, body=b"d", delay_ms=5_000),
    ):
        expect_error(
            INVALID,
            lambda m=delayed: produce(cluster, plain, m),  # type: ignore[misc]
            "messages[1]",
            f"topic '{normal}' takes NORMAL messages, and this message is DELAY",
            "--topic-message-type-check",
        )
    # Plain bodies (the bodies-only path) to a DELAY topic.
    expect_error(
        INVALID,
        lambda: produce(cluster, pb.ProduceMessage(topic=delay, body=b"x")),
        "messages[0]",
        "takes DELAY messages, and this message is NORMAL",
    )
    # A FIFO topic takes messages with a sharding key (their message group), not others.
    keyed = pb.ProduceMessage(topic=fifo, body=b"f", sharding_key="order-1")
    assert produce(cluster, keyed).results[0].status == pb.ProduceResult.SEND_OK
    expect_error(
        INVALID,
        lambda: produce(cluster, pb.ProduceMessage(topic=fifo, body=b"f", tags="T")),
        "is FIFO and this message has no message group",
        "sharding_key",
    )
    # A sharding key is still just a route on a NORMAL topic.
    routed = pb.ProduceMessage(topic=normal, body=b"k", sharding_key="order-1")
    assert produce(cluster, routed).results[0].status == pb.ProduceResult.SEND_OK
    # MIXED takes every type.
    for message in (
        pb.ProduceMessage(topic=mixed, body=b"m"),
        pb.ProduceMessage(topic=mixed, body=b"m", sharding_key="k"),
        pb.ProduceMessage(topic=mixed, body=b"m", properties={"TRAN_MSG": "true"}),
    ):
        assert produce(cluster, message).results[0].status == pb.ProduceResult.SEND_OK


def test_a_transactional_message_cannot_be_delayed(
    cluster: Cluster, typed_topics: dict[str, str]
) -> None:
    for message in (
        pb.ProduceMessage(
            topic=typed_topics["MIXED"], body=b"t", properties={"TRAN_MSG": "true"}, delay_level=2
        ),
        pb.ProduceMessage(
            topic=typed_topics["MIXED"], body=b"t", properties={"TRAN_MSG": "true"}, delay_ms=5
        ),
    ):
        expect_error(
            INVALID,
            lambda m=message: produce(cluster, m),  # type: ignore[misc]
            "messages[0]",
            "a transactional message cannot be delayed",
        )


@pytest.mark.parametrize(
    ("topic", "fragment"),
    [
        ("SCHEDULE_TOPIC_XXXX", "set delay_level on a message to its real topic instead"),
        ("rmq_sys_wheel_timer", "for a timed message set deliver_at_ms on its real topic"),
        ("%RETRY%g1", "consumer send-back"),
        ("%DLQ%g1", "tide dlq resend"),
        ("RMQ_SYS_TRANS_HALF_TOPIC", "send a transactional message to its real topic"),
    ],
)
def test_system_topics_refuse_ordinary_producers(
    cluster: Cluster, topic: str, fragment: str
) -> None:
    message = pb.ProduceMessage(topic=topic, body=b"x")
    expect_error(INVALID, lambda: produce(cluster, message), "messages[0].topic", fragment)
    stream = cluster.gateway.stub.ProduceStream(
        iter([pb.ProduceRequest(messages=[message])]), timeout=RPC_TIMEOUT_S
    )
    (answer,) = list(stream)
    assert answer.error_code == INVALID.value[0], answer
    assert fragment in answer.error_message


def test_system_topics_are_hidden_from_listings(cluster: Cluster) -> None:
    stub = cluster.gateway.stub
    shown = stub.ListTopics(ns_pb.ListRouteTopicsRequest(), timeout=RPC_TIMEOUT_S).topics
    assert "SCHEDULE_TOPIC_XXXX" not in shown and "rmq_sys_wheel_timer" not in shown
    every = stub.ListTopics(
        ns_pb.ListRouteTopicsRequest(include_hidden=True), timeout=RPC_TIMEOUT_S
    ).topics
    assert {"SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer"} <= set(every)
    # Each storage holds them from its start: 18 schedule queues, 1 timer queue.
    schedule = route(cluster, "SCHEDULE_TOPIC_XXXX")
    assert {(q.broker_name, q.write_queue_nums, q.perm) for q in schedule.queue_datas} == {
        ("broker-a", 18, 6),
        ("broker-b", 18, 6),
    }
    assert {q.write_queue_nums for q in route(cluster, "rmq_sys_wheel_timer").queue_datas} == {1}


def test_system_topics_cannot_be_created_or_deleted_through_admin(cluster: Cluster) -> None:
    for topic in ("SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer", "rmq_sys_other"):
        expect_error(
            INVALID,
            lambda t=topic: create(cluster, t, "", []),  # type: ignore[misc]
            "is a system topic every storage keeps; it cannot be created",
        )
    expect_error(
        INVALID,
        lambda: cluster.gateway.stub.DeleteTopic(
            storage_pb.DeleteTopicRequest(topic="SCHEDULE_TOPIC_XXXX"), timeout=RPC_TIMEOUT_S
        ),
        "cannot be deleted",
    )
    assert route(cluster, "SCHEDULE_TOPIC_XXXX").queue_datas  # still there


def test_the_check_can_be_turned_off(cluster: Cluster, typed_topics: dict[str, str]) -> None:
    """Last in the module: it restarts the gateway without the check (and back)."""
    cluster.restart_gateway("--no-topic-message-type-check")
    try:
        delayed = pb.ProduceMessage(topic=typed_topics["NORMAL"], body=b"d", delay_level=2)
        assert produce(cluster, delayed).results[0].status == pb.ProduceResult.SEND_OK
        plain = pb.ProduceMessage(topic=typed_topics["DELAY"], body=b"x")
        assert produce(cluster, plain).results[0].status == pb.ProduceResult.SEND_OK
        # The conflict and the system topics are refused all the same.
        conflict = pb.ProduceMessage(
            topic=typed_topics["NORMAL"], body=b"t", properties={"TRAN_MSG": "true"}, delay_ms=5
        )
        expect_error(INVALID, lambda: produce(cluster, conflict), "cannot be delayed")
        system = pb.ProduceMessage(topic="SCHEDULE_TOPIC_XXXX", body=b"x")
        expect_error(INVALID, lambda: produce(cluster, system), "written by the broker only")
    finally:
        cluster.restart_gateway()
