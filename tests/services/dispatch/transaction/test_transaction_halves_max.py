"""``--transaction-halves-max``: the transaction service holds at most that many
unresolved halves (the oldest); a later one stays in the half queue and is taken up once
older ones are resolved (here: discarded after their last check), so it is checked late
but never lost."""

from __future__ import annotations

from tests._cluster import Cluster, cluster_fixture
from tide.client import Admin, Message, Producer, TransactionResolution
from tide.waiting import wait_until

halves_cluster = cluster_fixture(
    name="halves_cluster",
    brokers=1,
    dispatch_args=(
        "--transaction-halves-max",
        "2",
        "--transaction-check-interval-ms",
        "1000",
        "--transaction-check-max",
        "1",
    ),
)


def unknown(message: Message, half: object) -> TransactionResolution:
    return TransactionResolution.UNKNOWN


def test_halves_past_the_bound_wait_in_the_half_queue_until_older_ones_go(
    halves_cluster: Cluster,
) -> None:
    topic, plain, group = "T_tx_bound", "T_tx_bound_plain", "PG_bound"
    gateway = halves_cluster.gateway.listen
    with Admin(gateway) as admin, Producer(gateway, producer_group=group) as producer:
        admin.create_topic(topic, read_queue_nums=1, message_type="TRANSACTION")
        admin.create_topic(plain, read_queue_nums=1)
        sent = [
            producer.send_transaction(Message(topic, f"open {i}"), unknown).transaction_id
            for i in range(3)
        ]
        # The dispatch files the commitlog in order: once a later message is queryable,
        # the three halves are in the half queue.
        marker = producer.send(plain, "after the halves")
        wait_until(
            lambda: admin.query_unique_key(plain, marker.unique_key),
            "the message after the halves to be dispatched",
        )
        held = [h.transaction_id for h in admin.list_transactions(group)]
        assert held == sent[:2]  # the oldest two; the third is not held
        # Checked once, then discarded: the third is read from the half queue then.
        wait_until(
            lambda: [h.transaction_id for h in admin.list_transactions(group)] == sent[2:],
            "the third half to be held once the first two were discarded",
            timeout_s=60,
            state=lambda: [h.transaction_id for h in admin.list_transactions(group)],
        )
        assert halves_cluster.broker("broker-a").dispatch.stderr().count("discarded") >= 2
