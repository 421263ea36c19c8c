"""The ordering and transaction metrics of a real cluster, scraped from /metrics: pulls
refused by reason (gateway), queue locks held and handed over (storage), half messages
stored and check-backs sent (gateway), resolutions by kind, checks made and unresolved
halves (dispatch)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from tests._cluster import Cluster
from tests._metrics import SCRAPE_INTERVAL_S, scrape, total
from tests.observability._support import telemetry_cluster
from tide.client import Admin, HalfMessage, Message, Producer, TransactionResolution
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

RPC_TIMEOUT_S = 20
BROKER = "broker-a"
CHECK_MAX = 5  # checks before a half is discarded: room for a producer's stream to take one


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("cluster")
    with telemetry_cluster(
        root,
        tmp_path_factory.mktemp("spans"),
        brokers=1,
        storage_args=("--rebalance-lock-max-live-time-ms", "1000"),
        dispatch_args=(
            "--transaction-check-interval-ms",
            "1000",
            "--transaction-check-max",
            str(CHECK_MAX),
        ),
    ) as c:
        yield c


def metrics_of(cluster: Cluster, service: str) -> dict[str, float]:
    broker = cluster.brokers[0]
    if service == "gateway":
        return scrape(cluster.gateway.ready["metrics"])
    process = broker.storage if service == "storage" else broker.dispatch
    return scrape(process.ready["metrics"])


def lock(cluster: Cluster, topic: str, group: str, client_id: str, unlock: bool = False) -> int:
    """Lock (or unlock) queue 0 of ``topic`` for ``client_id``: how many were locked."""
    request = pb.BrokerQueueLockRequest(
        broker_name=BROKER,
        request=storage_pb.QueueLockRequest(
            consumer_group=group,
            client_id=client_id,
            queues=[storage_pb.LockedQueue(topic=topic, queue_id=0)],
        ),
    )
    if unlock:
        cluster.gateway.stub.UnlockQueues(request, timeout=RPC_TIMEOUT_S)
        return 0
    return len(cluster.gateway.stub.LockQueues(request, timeout=RPC_TIMEOUT_S).locked)


def refused_pull(cluster: Cluster, topic: str, group: str, client_id: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        cluster.gateway.stub.Pull(
            pb.PullRequest(
                consumer_group=group,
                topic=topic,
                broker_name=BROKER,
                queue_id=0,
                client_id=client_id,
            ),
            timeout=RPC_TIMEOUT_S,
        )
    assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION, refused.value
    return refused.value


def test_pull_refusals_by_reason_and_queue_lock_handovers(cluster: Cluster) -> None:
    topic, group = "T_obs_locks", "G_obs_locks"
    cluster.create_topic(topic, queues=1)
    wait_until(  # past the storage's start grace (one lease)
        lambda: lock(cluster, topic, group, "member-a") == 1, "the storage to grant locks"
    )
    refused_pull(cluster, topic, group, "member-b")  # member-a holds queue 0
    lock(cluster, topic, group, "member-a", unlock=True)
    assert lock(cluster, topic, group, "member-b") == 1  # handed over after the release
    # A group whose config says consume_enable = false: refused by the consume gate.
    disabled = "G_obs_disabled"
    cluster.brokers[0].storage.stub.UpsertGroup(
        storage_pb.UpsertGroupRequest(
            group=storage_pb.GroupConfig(group_name=disabled, consume_enable=False)
        ),
        timeout=RPC_TIMEOUT_S,
    )
    refused_pull(cluster, topic, disabled, "")

    gateway = metrics_of(cluster, "gateway")
    assert total(gateway, "tide_gateway_pulls_refused_total", reason="queue_locked") >= 1
    assert total(gateway, "tide_gateway_pulls_refused_total", reason="consume_disabled") >= 1
    storage = metrics_of(cluster, "storage")
    assert total(storage, "tide_storage_queue_lock_handovers_total", reason="released") >= 1
    # The lock held now (member-b's), sampled about every second.
    wait_until(
        lambda: total(metrics_of(cluster, "storage"), "tide_storage_queue_locks") >= 1,
        "the storage to report the lock held",
        interval_s=SCRAPE_INTERVAL_S,
    )


def test_halves_resolutions_checks_and_discards(cluster: Cluster) -> None:
    topic = "T_obs_tx"
    gateway = cluster.gateway.listen
    checked: list[str] = []

    def checker(half: HalfMessage) -> TransactionResolution:
        checked.append(half.transaction_id)
        return TransactionResolution.COMMIT

    with (
        Admin(gateway) as admin,
        Producer(gateway, producer_group="PG_obs") as producer,
        Producer(gateway, producer_group="PG_obs_checked", transaction_checker=checker) as asked,
    ):
        admin.create_topic(topic, read_queue_nums=1, message_type="TRANSACTION")
        producer.send_transaction(Message(topic, "c"), lambda m, h: TransactionResolution.COMMIT)
        producer.send_transaction(Message(topic, "r"), lambda m, h: TransactionResolution.ROLLBACK)
        # No checker in PG_obs: checked CHECK_MAX times, then discarded.
        producer.send_transaction(Message(topic, "u"), lambda m, h: TransactionResolution.UNKNOWN)
        # PG_obs_checked's checker commits it when asked.
        late = asked.send_transaction(
            Message(topic, "late"), lambda m, h: TransactionResolution.UNKNOWN
        )

        gateway_metrics = metrics_of(cluster, "gateway")
        assert total(gateway_metrics, "tide_gateway_transaction_halves_total") >= 4

        def resolved(resolution: str) -> float:
            found = metrics_of(cluster, "dispatch")
            return total(found, "tide_dispatch_transactions_resolved_total", resolution=resolution)

        wait_until(
            lambda: resolved("commit") >= 2 and resolved("rollback") >= 1,
            "the commits (one answering a check) and the rollback to be counted",
            state=lambda: (checked, metrics_of(cluster, "dispatch")),
            interval_s=SCRAPE_INTERVAL_S,
        )
        assert late.transaction_id in checked
        assert total(metrics_of(cluster, "gateway"), "tide_gateway_transaction_checks_sent_total")
        wait_until(
            lambda: resolved("discard") >= 1,
            "the unresolved half to be discarded after its last check",
            timeout_s=60,
            interval_s=SCRAPE_INTERVAL_S,
        )
    dispatch = metrics_of(cluster, "dispatch")
    assert total(dispatch, "tide_dispatch_transaction_checks_total") >= CHECK_MAX + 1
    wait_until(  # sampled about every second: the discarded half is gone
        lambda: (
            total(metrics_of(cluster, "dispatch"), "tide_dispatch_transaction_halves_unresolved")
            == 0
        ),
        "no unresolved half held",
        interval_s=SCRAPE_INTERVAL_S,
    )
    assert total(dispatch, "tide_dispatch_transaction_halves_kept") == 0
