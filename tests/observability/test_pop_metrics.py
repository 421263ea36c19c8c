"""The POP metrics of a real cluster, scraped from /metrics (docs/pop.md, "Metrics"):
checkpoints held, messages received / acked / revived / dead-lettered and the revive lag
(dispatch), Receives held (gateway)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests._cluster import Cluster
from tests._metrics import SCRAPE_INTERVAL_S, scrape, total
from tests.observability._support import telemetry_cluster
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until

RPC_TIMEOUT_S = 20
INVISIBLE_MS = 30_000
SHORT_MS = 300  # ChangeInvisibleDuration to this: due for revive soon


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with telemetry_cluster(
        tmp_path_factory.mktemp("cluster"),
        tmp_path_factory.mktemp("spans"),
        brokers=1,
        dispatch_args=("--pop-revive-interval-ms", "100"),
    ) as c:
        yield c


def dispatch_metric(cluster: Cluster, name: str) -> float:
    return total(scrape(cluster.brokers[0].dispatch.ready["metrics"]), name)


def gateway_metric(cluster: Cluster, name: str) -> float:
    return total(scrape(cluster.gateway.ready["metrics"]), name)


def wait_metric(cluster: Cluster, name: str, value: float, gateway: bool = False) -> None:
    read = gateway_metric if gateway else dispatch_metric
    wait_until(
        lambda: read(cluster, name) == value,
        f"{name} == {value}",
        state=lambda: read(cluster, name),
        interval_s=SCRAPE_INTERVAL_S,
    )


def receive(cluster: Cluster, topic: str, group: str, count: int) -> list[pb.ReceivedMessage]:
    got: list[pb.ReceivedMessage] = []

    def more() -> bool:
        reply = cluster.gateway.stub.Receive(
            pb.ReceiveRequest(
                consumer_group=group,
                topic=topic,
                max_messages=count - len(got),
                invisible_duration_ms=INVISIBLE_MS,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        got.extend(reply.messages)
        return len(got) >= count

    wait_until(more, f"{count} messages received", state=lambda: len(got))
    return got


def test_pop_counters_and_gauges_follow_receive_ack_revive_and_dead_letter(
    cluster: Cluster,
) -> None:
    topic, group = "T_pop_metrics", "G_pop_metrics"
    stub = cluster.gateway.stub
    cluster.create_topic(topic, queues=1)
    stub.Produce(
        pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic, body=b"m")] * 3),
        timeout=RPC_TIMEOUT_S,
    )
    first, second, third = receive(cluster, topic, group, 3)
    wait_metric(cluster, "tide_dispatch_pop_received_total", 3)
    wait_metric(cluster, "tide_dispatch_pop_checkpoints_held", 3)

    stub.Ack(
        pb.AckRequest(
            consumer_group=group,
            topic=topic,
            entries=[pb.AckEntry(receipt_handle=first.receipt_handle)],
        ),
        timeout=RPC_TIMEOUT_S,
    )
    wait_metric(cluster, "tide_dispatch_pop_acked_total", 1)
    stub.ForwardToDeadLetter(
        pb.ForwardToDeadLetterRequest(
            consumer_group=group, topic=topic, receipt_handle=third.receipt_handle
        ),
        timeout=RPC_TIMEOUT_S,
    )
    wait_metric(cluster, "tide_dispatch_pop_dead_lettered_total", 1)
    wait_metric(cluster, "tide_dispatch_pop_checkpoints_held", 1)

    # The second one's invisible time is cut short: the revive service delivers it again.
    stub.ChangeInvisibleDuration(
        pb.ChangeInvisibleDurationRequest(
            consumer_group=group,
            topic=topic,
            receipt_handle=second.receipt_handle,
            invisible_duration_ms=SHORT_MS,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    wait_metric(cluster, "tide_dispatch_pop_revived_total", 1)
    wait_metric(cluster, "tide_dispatch_pop_checkpoints_held", 0)
    # Nothing is due now: no revive is waiting.
    assert dispatch_metric(cluster, "tide_dispatch_pop_revive_lag_milliseconds") == 0
    (again,) = receive(cluster, topic, group, 1)
    assert again.delivery_attempt == 2
    assert dispatch_metric(cluster, "tide_dispatch_pop_received_total") == 4


def test_held_receives_gauge(cluster: Cluster) -> None:
    topic, group = "T_pop_metrics_held", "G_pop_metrics_held"
    cluster.create_topic(topic, queues=1)
    future = cluster.gateway.stub.Receive.future(
        pb.ReceiveRequest(
            consumer_group=group,
            topic=topic,
            max_messages=1,
            invisible_duration_ms=INVISIBLE_MS,
            long_poll_timeout_ms=25_000,
        ),
        timeout=60,
    )
    wait_metric(cluster, "tide_gateway_held_receives", 1, gateway=True)
    cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic, body=b"wake")]),
        timeout=RPC_TIMEOUT_S,
    )
    assert len(future.result(timeout=60).messages) == 1
    wait_metric(cluster, "tide_gateway_held_receives", 0, gateway=True)
