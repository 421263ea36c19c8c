"""Transactional sends through the client against a real cluster (services as processes):
commit, rollback, bad EndTransactions, and the check-back over the producer's stream
(the dispatches check after 1 s here)."""

from __future__ import annotations

import threading

import grpc
import pytest

from tests._cluster import Cluster, cluster_fixture
from tide.client import (
    Admin,
    HalfMessage,
    InvalidArgument,
    Message,
    Producer,
    ReceivedMessage,
    SendResult,
    TransactionResolution,
)
from tide.format import PGROUP, REAL_TOPIC, TRAN_MSG, TRANS_HALF_TOPIC
from tide.v1 import gateway_pb2, gateway_pb2_grpc
from tide.waiting import wait_until

COMMIT = TransactionResolution.COMMIT
ROLLBACK = TransactionResolution.ROLLBACK
UNKNOWN = TransactionResolution.UNKNOWN

tx_cluster = cluster_fixture(
    name="tx_cluster",
    brokers=1,
    dispatch_args=("--transaction-check-interval-ms", "1000", "--transaction-check-max", "3"),
)


def copies(admin: Admin, topic: str, unique_key: str) -> list[ReceivedMessage]:
    return admin.query_unique_key(topic, unique_key)


def test_commit_delivers_once_and_rollback_never(tx_cluster: Cluster) -> None:
    topic = "T_tx_commit"
    gateway = tx_cluster.gateway.listen
    with Admin(gateway) as admin, Producer(gateway, producer_group="PG_tx") as producer:
        admin.create_topic(topic, read_queue_nums=2, message_type="TRANSACTION")
        seen: list[SendResult] = []

        def commit(message: Message, half: SendResult) -> TransactionResolution:
            stored = admin.query_id(half.msg_id)  # the half: stored, in the half topic
            assert stored.topic == TRANS_HALF_TOPIC
            assert stored.properties[REAL_TOPIC] == topic
            assert (stored.properties[TRAN_MSG], stored.properties[PGROUP]) == ("true", "PG_tx")
            assert not copies(admin, topic, half.unique_key)  # invisible until committed
            seen.append(half)
            return COMMIT

        outcome = producer.send_transaction(Message(topic, "paid", keys=["order-1"]), commit)
        assert outcome.resolution is COMMIT and outcome.committed is not None and seen
        assert outcome.committed.queue == outcome.half.queue  # the real queue, chosen at send
        committed = admin.query_id(outcome.committed.msg_id)
        assert committed.queue == outcome.half.queue
        assert committed.topic == topic and committed.body == b"paid"
        assert REAL_TOPIC not in committed.properties
        wait_until(lambda: copies(admin, topic, outcome.half.unique_key), "the committed copy")
        assert len(copies(admin, topic, outcome.half.unique_key)) == 1

        rolled = producer.send_transaction(Message(topic, "cancelled"), lambda m, h: ROLLBACK)
        assert rolled.resolution is ROLLBACK and rolled.committed is None and not rolled.error
        listed = producer_halves(gateway, "PG_tx")
        assert outcome.half.queue_offset not in listed
        assert rolled.half.queue_offset not in listed
        assert not copies(admin, topic, rolled.half.unique_key)


def producer_halves(gateway: str, group: str) -> set[int]:
    with grpc.insecure_channel(gateway) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        listed = stub.ListTransactions(
            gateway_pb2.ListTransactionsRequest(producer_group=group), timeout=30
        )
    return {half.queue_offset for half in listed.halves}


def end(gateway: str, request: gateway_pb2.EndTransactionRequest) -> None:
    with grpc.insecure_channel(gateway) as channel:
        gateway_pb2_grpc.GatewayStub(channel).EndTransaction(request, timeout=30)


def test_end_transaction_refuses_bad_input(tx_cluster: Cluster) -> None:
    topic = "T_tx_bad"
    gateway = tx_cluster.gateway.listen
    with Admin(gateway) as admin, Producer(gateway, producer_group="PG_bad") as producer:
        admin.create_topic(topic, read_queue_nums=1, message_type="TRANSACTION")
        outcome = producer.send_transaction(Message(topic, "x"), lambda m, h: UNKNOWN)
        half = outcome.half
        good = gateway_pb2.EndTransactionRequest(
            producer_group="PG_bad",
            broker_name=half.queue.broker_name,
            msg_id=half.msg_id,
            queue_offset=half.queue_offset,
            transaction_id=outcome.transaction_id,
            resolution=gateway_pb2.COMMIT,
        )
        cases: list[tuple[dict[str, object], grpc.StatusCode, str]] = [
            ({"transaction_id": "other"}, grpc.StatusCode.INVALID_ARGUMENT, "does not match"),
            ({"producer_group": "PG_other"}, grpc.StatusCode.INVALID_ARGUMENT, "PG_other"),
            ({"queue_offset": 999_999, "msg_id": ""}, grpc.StatusCode.NOT_FOUND, "no half"),
        ]
        for change, code, text in cases:
            request = gateway_pb2.EndTransactionRequest()
            request.CopyFrom(good)
            for name, value in change.items():
                setattr(request, name, value)
            with pytest.raises(grpc.RpcError) as raised:
                end(gateway, request)
            assert raised.value.code() is code and text in str(raised.value.details())
        end(gateway, good)
        with pytest.raises(grpc.RpcError) as again:
            end(gateway, good)
        assert again.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "resolved already" in str(again.value.details())
        wait_until(lambda: copies(admin, topic, half.unique_key), "the committed copy")
        assert len(copies(admin, topic, half.unique_key)) == 1  # nothing written twice

        with pytest.raises(InvalidArgument):
            producer.send_transaction(Message(topic, "late", delay_level=1), lambda m, h: COMMIT)
        message = gateway_pb2.ProduceMessage(
            topic=topic, body=b"x", transactional=True, producer_group="PG_bad", delay_level=1
        )
        with pytest.raises(grpc.RpcError) as delayed, grpc.insecure_channel(gateway) as channel:
            gateway_pb2_grpc.GatewayStub(channel).Produce(
                gateway_pb2.ProduceRequest(messages=[message]), timeout=30
            )
        assert delayed.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "cannot be delayed" in str(delayed.value.details())


def test_unresolved_halves_are_checked_with_a_live_producer(tx_cluster: Cluster) -> None:
    topic = "T_tx_check"
    gateway = tx_cluster.gateway.listen
    asked: list[HalfMessage] = []
    lock = threading.Lock()

    def checker(half: HalfMessage) -> TransactionResolution:
        with lock:
            asked.append(half)
        return COMMIT if half.body == b"commit me" else ROLLBACK

    with Admin(gateway) as admin, Producer(gateway, producer_group="PG_check") as producer:
        admin.create_topic(topic, read_queue_nums=1, message_type="TRANSACTION")
        kept = producer.send_transaction(Message(topic, "commit me"), lambda m, h: UNKNOWN)
        dropped = producer.send_transaction(Message(topic, "roll me"), lambda m, h: UNKNOWN)
        # (the dispatch learns of the halves from the storage's Tail: wait for it)
        wait_until(
            lambda: (
                {kept.half.queue_offset, dropped.half.queue_offset}
                <= producer_halves(gateway, "PG_check")
            ),
            "both halves listed as unresolved for the group",
        )
        with Producer(gateway, producer_group="PG_check", transaction_checker=checker):
            wait_until(
                lambda: not producer_halves(gateway, "PG_check"),
                "the checks to resolve both halves",
                timeout_s=60,
            )
        assert {half.transaction_id for half in asked} >= {
            kept.transaction_id,
            dropped.transaction_id,
        }
        assert all(half.checks >= 1 and half.topic == topic for half in asked)
        wait_until(lambda: copies(admin, topic, kept.half.unique_key), "the committed copy")
        assert len(copies(admin, topic, kept.half.unique_key)) == 1
        assert not copies(admin, topic, dropped.half.unique_key)


def test_unchecked_halves_are_discarded_after_the_last_check(tx_cluster: Cluster) -> None:
    """No producer of the group answers: after 3 checks (--transaction-check-max) the half
    is discarded and never delivered."""
    topic = "T_tx_discard"
    gateway = tx_cluster.gateway.listen
    with Admin(gateway) as admin, Producer(gateway, producer_group="PG_gone") as producer:
        admin.create_topic(topic, read_queue_nums=1, message_type="TRANSACTION")
        left = producer.send_transaction(Message(topic, "orphan"), lambda m, h: UNKNOWN)
        wait_until(
            lambda: left.half.queue_offset not in producer_halves(gateway, "PG_gone"),
            "the half to be discarded",
            timeout_s=60,
        )
        assert not copies(admin, topic, left.half.unique_key)
