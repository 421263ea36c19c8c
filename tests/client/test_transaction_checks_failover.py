"""The producer's check stream moves to another gateway when its gateway dies: a
``Producer`` given both gateways (a gRPC target of two addresses) reopens the stream on
the one alive, and unresolved halves are checked through it and committed once."""

from __future__ import annotations

import threading

from tests._cluster import Cluster, cluster_fixture
from tests._service_process import free_port
from tide.client import Admin, HalfMessage, Message, Producer, TransactionResolution
from tide.waiting import wait_until

UNKNOWN = TransactionResolution.UNKNOWN

failover_cluster = cluster_fixture(
    name="failover_cluster",
    brokers=1,
    dispatch_args=("--transaction-check-interval-ms", "1000"),
)


def test_the_check_stream_reconnects_to_the_other_gateway(failover_cluster: Cluster) -> None:
    topic, group = "T_tx_failover", "PG_failover"
    gateway_a = failover_cluster.gateway
    address_b = f"127.0.0.1:{free_port()}"  # B starts once A is dead, on this port
    a_killed = threading.Event()
    checks: list[tuple[bool, str]] = []  # (after A was killed, transaction id)
    lock = threading.Lock()

    def checker(half: HalfMessage) -> TransactionResolution:
        after = a_killed.is_set()
        with lock:
            checks.append((after, half.transaction_id))
        # Unknown while A lives: the half stays open across the failover.
        return TransactionResolution.COMMIT if after else UNKNOWN

    def checked(after: bool, transaction_id: str) -> bool:
        with lock:
            return (after, transaction_id) in checks

    with Admin(gateway_a.listen) as admin, Producer(gateway_a.listen, producer_group=group) as p:
        admin.create_topic(topic, read_queue_nums=1, message_type="TRANSACTION")
        before = p.send_transaction(Message(topic, "before"), lambda m, h: UNKNOWN)
    target = f"ipv4:{gateway_a.listen},{address_b}"
    with Producer(target, producer_group=group, transaction_checker=checker):
        # Only A is up: the stream is A's, and A hands it the half's checks.
        wait_until(lambda: checked(False, before.transaction_id), "a check through gateway A")
        gateway_a.kill()
        a_killed.set()
        gateway_b = failover_cluster.add_gateway(listen=address_b)
        with (
            Admin(gateway_b.listen) as admin,
            Producer(gateway_b.listen, producer_group=group) as producer,
        ):
            # Written once A is dead: only B's stream can be asked about it.
            after = producer.send_transaction(Message(topic, "after"), lambda m, h: UNKNOWN)
            ids = [before.transaction_id, after.transaction_id]
            wait_until(
                lambda: all(checked(True, tid) for tid in ids),
                "checks of both halves through gateway B",
                timeout_s=60,
            )
            wait_until(lambda: not admin.list_transactions(group), "both halves resolved")
            keys = [before.half.unique_key, after.half.unique_key]
            wait_until(
                lambda: all(admin.query_unique_key(topic, key) for key in keys),
                "the committed copies",
            )
            # Committed exactly once each.
            assert [len(admin.query_unique_key(topic, key)) for key in keys] == [1, 1]
