"""Gateway.RecallMessage against a real cluster: a timed message (appended to a broker's
timer topic as the gateway's produce rewrite stores it) is recalled before it is due and
never delivered, while its neighbour in the same slot is; and every refusal: after the
delivery, a message that is not timed, an id no broker has, an id that is no id. Also
through the client (``Admin.recall``)."""

from __future__ import annotations

import time

import grpc
import pytest

from tests._cluster import Cluster
from tests.services.dispatch.delivery._timed import count_keys, delivered, timed
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.client import Admin, FailedPrecondition
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until


def _recall(cluster: Cluster, msg_id: str) -> pb.RecallMessageResponse:
    return cluster.gateway.stub.RecallMessage(
        pb.RecallMessageRequest(msg_id=msg_id), timeout=RPC_TIMEOUT_S
    )


def test_recall_cancels_a_timed_message_before_it_is_due(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-a"])
    broker = cluster.broker("broker-a")
    at = time.time_ns() // 1_000_000 + 4000
    kept, gone = broker.storage.append(
        [timed(topic_name, at, "kept"), timed(topic_name, at, "gone")]
    )
    answer = _recall(cluster, gone.msg_id)
    assert (answer.unique_key, answer.deliver_at_ms) == ("gone", at)

    wait_until(
        lambda: broker.dispatch.status().delivery.timer_delivered_to_ms > at,
        "the slot of both messages to fire",
        timeout_s=30,
        state=lambda: broker.dispatch.status().delivery,
    )
    wait_until(lambda: delivered(broker.dispatch, broker.storage, topic_name), "the kept one")
    assert count_keys(delivered(broker.dispatch, broker.storage, topic_name)) == {"kept": 1}
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: _recall(cluster, kept.msg_id),
        "has been delivered",
        "can no longer be recalled",
    )
    with Admin(cluster.gateway.listen) as admin, pytest.raises(FailedPrecondition):
        admin.recall(kept.msg_id)


def test_recall_through_the_client(cluster: Cluster, topic_name: str) -> None:
    broker = cluster.broker("broker-a")
    at = time.time_ns() // 1_000_000 + 600_000  # not due during the test
    (stored,) = broker.storage.append([timed(topic_name, at, "later")])
    with Admin(cluster.gateway.listen) as admin:
        recalled = admin.recall(stored.msg_id)
    assert recalled == ("later", at)


def test_recall_refusals(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-a"])
    produced = cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic_name, body=b"now")]),
        timeout=RPC_TIMEOUT_S,
    )
    normal = produced.results[0].msg_id
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: _recall(cluster, normal),
        "is not a timed message",
        topic_name,
    )
    missing = normal[:-16] + f"{1 << 40:016X}"  # the same storage, an offset it never had
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: _recall(cluster, missing), "not found")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: _recall(cluster, "xyz"), "msg_id")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: _recall(cluster, ""), "msg_id")
