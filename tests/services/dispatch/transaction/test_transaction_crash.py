"""Transactions survive SIGKILL of storage, dispatch and gateway: unresolved halves are
still listed and checked after the restart, a committed one is in its topic once (the
commit copy and the op record are one Append, and the resolution is known again: a
second commit is refused), a rolled-back one never."""

from __future__ import annotations

import grpc
import pytest

from tests._cluster import Cluster, cluster_fixture
from tests.cli.test_gateway_commands import ok, tide
from tide.client import (
    Admin,
    HalfMessage,
    Message,
    MessageQueue,
    Producer,
    PullStatus,
    TransactionResolution,
)
from tide.v1 import gateway_pb2
from tide.waiting import wait_until

COMMIT = TransactionResolution.COMMIT
ROLLBACK = TransactionResolution.ROLLBACK
UNKNOWN = TransactionResolution.UNKNOWN
GROUP = "PG_crash"
TOPIC = "T_tx_crash"

crash_cluster = cluster_fixture(
    name="crash_cluster",
    brokers=1,
    scope="function",
    # Checks every second, and many of them: the halves outlive the restart unresolved.
    dispatch_args=("--transaction-check-interval-ms", "1000", "--transaction-check-max", "1000"),
)


def bodies(admin: Admin, cluster: Cluster) -> list[bytes]:
    """Every message stored in the topic (what each consumer group is delivered)."""
    found: list[bytes] = []
    for queue_id in range(2):
        queue, offset = MessageQueue(TOPIC, "broker-a", queue_id), 0
        while True:
            result = admin.browse_queue(queue, offset, 32)
            found += [message.body for message in result.messages]
            if result.status is PullStatus.NO_NEW_MESSAGE or result.next_offset <= offset:
                break
            offset = result.next_offset
    return sorted(found)


def test_halves_survive_sigkill_of_every_service(crash_cluster: Cluster) -> None:
    cluster = crash_cluster
    gateway = cluster.gateway.listen
    with Admin(gateway) as admin, Producer(gateway, producer_group=GROUP) as producer:
        admin.create_topic(TOPIC, read_queue_nums=2, message_type="TRANSACTION")
        committed = producer.send_transaction(Message(TOPIC, b"committed"), lambda m, h: COMMIT)
        producer.send_transaction(Message(TOPIC, b"rolled back"), lambda m, h: ROLLBACK)
        pending = [
            producer.send_transaction(Message(TOPIC, body), lambda m, h: UNKNOWN)
            for body in (b"commit on check", b"roll back on check")
        ]
    assert committed.committed is not None
    # Checked at least once before the crash (no producer answers): counts are saved.
    wait_until(
        lambda: all(half.checks >= 1 for half in Admin(gateway).list_transactions(GROUP)),
        "a check of each pending half",
    )

    broker = cluster.broker("broker-a")
    broker.master.kill()
    gateway = cluster.restart_gateway(kill=True).listen
    cluster.restart(broker.master)
    wait_until(lambda: "broker-a" in cluster.registered_brokers(), "broker-a registered")

    with Admin(gateway) as admin:
        wait_until(lambda: _listed(admin), "the pending halves listed after the restart")
        listed = {half.transaction_id: half for half in admin.list_transactions(GROUP)}
        assert set(listed) == {outcome.transaction_id for outcome in pending}
        assert all(half.checks >= 1 for half in listed.values())  # the saved counts
        printed = ok(tide(cluster, "transactions", "list", "--group", GROUP))
        assert all(outcome.transaction_id in printed for outcome in pending)
        assert printed.splitlines()[0].split()[:2] == ["BROKER", "GROUP"]

        # The committed one is known as resolved: a second commit writes nothing.
        request = gateway_pb2.EndTransactionRequest(
            producer_group=GROUP,
            broker_name=committed.half.queue.broker_name,
            msg_id=committed.half.msg_id,
            queue_offset=committed.half.queue_offset,
            transaction_id=committed.transaction_id,
            resolution=gateway_pb2.COMMIT,
        )
        with pytest.raises(grpc.RpcError) as again:
            cluster.gateway.stub.EndTransaction(request, timeout=30)
        assert again.value.code() is grpc.StatusCode.FAILED_PRECONDITION

        def checker(half: HalfMessage) -> TransactionResolution:
            return COMMIT if half.body == b"commit on check" else ROLLBACK

        with Producer(gateway, producer_group=GROUP, transaction_checker=checker):
            wait_until(
                lambda: not admin.list_transactions(GROUP),
                "the checks to resolve the pending halves",
                timeout_s=60,
            )
        wait_until(lambda: len(bodies(admin, cluster)) >= 2, "the committed copies", timeout_s=30)
        assert bodies(admin, cluster) == [b"commit on check", b"committed"]


def _listed(admin: Admin) -> bool:
    try:
        return len(admin.list_transactions(GROUP)) == 2
    except Exception:  # the broker's dispatch or its route is not back yet
        return False
