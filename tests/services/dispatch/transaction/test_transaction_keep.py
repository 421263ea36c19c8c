"""``--transaction-keep-after-max``: a half past its last check is kept unresolved, no
longer checked, and logged; ``tide transactions list --json`` shows it with its checks."""

from __future__ import annotations

import json
from pathlib import Path

from tests._cluster import Cluster, cluster_fixture
from tests.cli.test_gateway_commands import ok, tide
from tide.client import Admin, Message, Producer, TransactionResolution
from tide.format import TRANSACTION_CHECKS_FILE, decode_transaction_checks
from tide.waiting import wait_until


def check_counts(store_dir: Path) -> dict[int, int] | None:
    path = store_dir / "config" / TRANSACTION_CHECKS_FILE
    return decode_transaction_checks(json.loads(path.read_bytes())) if path.exists() else None


keep_cluster = cluster_fixture(
    name="keep_cluster",
    brokers=1,
    dispatch_args=(
        "--transaction-check-interval-ms",
        "1000",
        "--transaction-check-max",
        "2",
        "--transaction-keep-after-max",
    ),
)


def test_a_half_past_the_last_check_is_kept_and_no_longer_checked(keep_cluster: Cluster) -> None:
    topic, group = "T_tx_keep", "PG_keep"
    gateway = keep_cluster.gateway.listen
    with Admin(gateway) as admin, Producer(gateway, producer_group=group) as producer:
        admin.create_topic(topic, read_queue_nums=1, message_type="TRANSACTION")
        left = producer.send_transaction(
            Message(topic, "kept"), lambda m, h: TransactionResolution.UNKNOWN
        )
        dispatch = keep_cluster.broker("broker-a").dispatch
        wait_until(
            lambda: "no longer checked" in dispatch.stderr(),
            "the dispatch to log the kept half",
            timeout_s=60,
        )
        (half,) = admin.list_transactions(group)
        assert (half.transaction_id, half.checks) == (left.transaction_id, 2)
        document = json.loads(ok(tide(keep_cluster, "transactions", "list", "--json")))
        (listed,) = [h for h in document["halves"] if h["producer_group"] == group]
        assert (listed["topic"], listed["checks"]) == (topic, 2)
        assert listed["msg_id"] == left.half.msg_id and listed["age_s"] >= 0
        assert not admin.query_unique_key(topic, left.half.unique_key)
        # The check counts reach the storage (a slave copies them from there), the same
        # bytes' content as the dispatch's own file.
        broker = keep_cluster.broker("broker-a")
        wait_until(
            lambda: (
                check_counts(broker.storage.store_dir)
                == check_counts(dispatch.store_dir)
                == {half.queue_offset: 2}
            ),
            "the storage to hold the dispatch's transaction check counts",
            state=lambda: (
                check_counts(broker.storage.store_dir),
                check_counts(dispatch.store_dir),
            ),
        )
