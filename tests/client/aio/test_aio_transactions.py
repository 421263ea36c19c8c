"""tide.client.aio's transactional sends against a real cluster (mirrors the core cases
of tests/client/test_transactions.py): commit and rollback, bad input, and the
check-back answered by an async checker over the producer's stream (the dispatches
check after 1 s here)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from tests._cluster import Cluster, cluster_fixture
from tide.client import (
    Admin,
    HalfMessage,
    InvalidArgument,
    Message,
    ReceivedMessage,
    SendResult,
    TransactionOutcome,
    TransactionResolution,
)
from tide.client.aio import Producer
from tide.format import REAL_TOPIC, TRANS_HALF_TOPIC
from tide.v1 import gateway_pb2, gateway_pb2_grpc
from tide.waiting import wait_until, wait_until_async

COMMIT = TransactionResolution.COMMIT
ROLLBACK = TransactionResolution.ROLLBACK
UNKNOWN = TransactionResolution.UNKNOWN

aio_tx_cluster = cluster_fixture(
    name="aio_tx_cluster",
    brokers=1,
    dispatch_args=("--transaction-check-interval-ms", "1000", "--transaction-check-max", "3"),
)


def copies(admin: Admin, topic: str, unique_key: str) -> list[ReceivedMessage]:
    return admin.query_unique_key(topic, unique_key)


def producer_halves(gateway: str, group: str) -> set[int]:
    with grpc.insecure_channel(gateway) as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        listed = stub.ListTransactions(
            gateway_pb2.ListTransactionsRequest(producer_group=group), timeout=30
        )
    return {half.queue_offset for half in listed.halves}


async def unknown(message: Message, half: SendResult) -> TransactionResolution:
    return UNKNOWN


async def rollback(message: Message, half: SendResult) -> TransactionResolution:
    return ROLLBACK


def test_commit_delivers_once_and_rollback_never(aio_tx_cluster: Cluster) -> None:
    topic = "T_aio_tx_commit"
    gateway = aio_tx_cluster.gateway.listen
    with Admin(gateway) as admin:
        admin.create_topic(topic, read_queue_nums=2, message_type="TRANSACTION")

        async def commit(message: Message, half: SendResult) -> TransactionResolution:
            stored = await asyncio.to_thread(admin.query_id, half.msg_id)
            assert stored.topic == TRANS_HALF_TOPIC and stored.properties[REAL_TOPIC] == topic
            assert not copies(admin, topic, half.unique_key)  # invisible until committed
            return COMMIT

        async def run() -> tuple[TransactionOutcome, TransactionOutcome]:
            async with Producer(gateway, producer_group="PG_aio_tx") as producer:
                done = await producer.send_transaction(Message(topic, "paid"), commit)
                rolled = await producer.send_transaction(Message(topic, "no"), rollback)
                return done, rolled

        outcome, rolled = asyncio.run(run())
        assert outcome.resolution is COMMIT and outcome.committed is not None
        committed = admin.query_id(outcome.committed.msg_id)
        assert committed.topic == topic and committed.body == b"paid"
        unique = outcome.half.unique_key
        wait_until(lambda: copies(admin, topic, unique), "the committed copy")
        assert len(copies(admin, topic, unique)) == 1
        assert rolled.resolution is ROLLBACK and rolled.committed is None
        assert not rolled.error
        assert not copies(admin, topic, rolled.half.unique_key)
        assert not producer_halves(gateway, "PG_aio_tx")


def test_bad_transactional_input_is_refused(aio_tx_cluster: Cluster) -> None:
    gateway = aio_tx_cluster.gateway.listen

    def checker(half: HalfMessage) -> TransactionResolution:  # not a coroutine function
        return COMMIT

    async def run() -> None:
        async with Producer(gateway) as plain:
            with pytest.raises(InvalidArgument, match="producer_group"):
                await plain.send_transaction(Message("T_aio_tx_bad", "x"), unknown)
        async with Producer(gateway, producer_group="PG_aio_bad") as producer:
            with pytest.raises(InvalidArgument, match="delayed"):
                await producer.send_transaction(
                    Message("T_aio_tx_bad", "x", delay_level=1), unknown
                )
        with pytest.raises(InvalidArgument, match="producer_group"):
            Producer(gateway, producer_group="bad group!")
        with pytest.raises(InvalidArgument, match="coroutine function"):
            Producer(gateway, producer_group="PG_aio_bad", transaction_checker=checker)  # type: ignore[arg-type]

    asyncio.run(run())


def test_unresolved_halves_are_checked_by_an_async_checker(aio_tx_cluster: Cluster) -> None:
    topic = "T_aio_tx_check"
    gateway = aio_tx_cluster.gateway.listen
    asked: list[HalfMessage] = []

    async def checker(half: HalfMessage) -> TransactionResolution:
        asked.append(half)
        return COMMIT if half.body == b"commit me" else ROLLBACK

    with Admin(gateway) as admin:
        admin.create_topic(topic, read_queue_nums=1, message_type="TRANSACTION")

        async def run() -> tuple[str, str, str, str]:
            async with Producer(gateway, producer_group="PG_aio_check") as producer:
                kept = await producer.send_transaction(Message(topic, "commit me"), unknown)
                dropped = await producer.send_transaction(Message(topic, "roll me"), unknown)
            both = {kept.half.queue_offset, dropped.half.queue_offset}
            # The dispatch learns of the halves through the storage's Tail, which may send
            # a busy stream's appends a few ms later: wait for it to list them.
            await asyncio.to_thread(
                wait_until,
                lambda: both <= producer_halves(gateway, "PG_aio_check"),
                "both halves listed as unresolved",
            )
            async with Producer(
                gateway, producer_group="PG_aio_check", transaction_checker=checker
            ) as checking:

                async def resolved() -> bool:
                    return not await asyncio.to_thread(producer_halves, gateway, "PG_aio_check")

                await wait_until_async(resolved, "the checks to resolve both halves", 60)
                checks = checking._checks
                assert checks is not None
                # A half is resolved (the dispatch applied it) before its EndTransaction's
                # answer is back in the listener, which counts it then.
                await wait_until_async(
                    lambda: checks.answered >= 2,
                    "both answers counted",
                    60,
                    state=lambda: f"{checks.answered} answered",
                )
            return (
                kept.transaction_id,
                dropped.transaction_id,
                kept.half.unique_key,
                dropped.half.unique_key,
            )

        kept_id, dropped_id, kept_key, dropped_key = asyncio.run(run())
        assert {half.transaction_id for half in asked} >= {kept_id, dropped_id}
        assert all(half.checks >= 1 and half.topic == topic for half in asked)
        wait_until(lambda: copies(admin, topic, kept_key), "the committed copy")
        assert len(copies(admin, topic, kept_key)) == 1
        assert not copies(admin, topic, dropped_key)
