"""The services' metric modules in-process, with fakes: what the samples report and what
the gateway's handler wrappers count (no meter provider is installed: instruments are
no-ops, the samples and totals are plain values)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from services.dispatch.arrivals import ArrivalHub
from services.dispatch.delivery.schedule import ScheduleState
from services.dispatch.metrics import DispatchMetrics
from services.gateway.metrics import MAX_LAG_QUEUES, GatewayMetrics
from services.nameserver.metrics import NameServerMetrics
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def dispatch_state(dispatched: int, storage_max: int) -> Any:
    status = SimpleNamespace(
        dispatched_offset=dispatched,
        durable_offset=dispatched,
        queues=3,
        cq_segments=3,
        index_files=1,
        index_entries=7,
        disk_full="",
    )
    store = SimpleNamespace(status=lambda: status)
    dispatcher = SimpleNamespace(
        storage_max_seen=storage_max, tail_reconnects=2, follower_state="connected"
    )
    return SimpleNamespace(
        store=store, dispatcher=dispatcher, schedule=None, timer=None, transactions=None, pop=None
    )


def test_dispatch_lag_in_bytes_and_time_behind() -> None:
    clock = Clock()
    state = {"running": dispatch_state(100, 100)}
    metrics = DispatchMetrics(lambda: state["running"], ArrivalHub(), clock)
    sample = cast(dict[str, Any], metrics.sample())
    assert sample["tide_dispatch_lag_bytes"] == 0
    assert sample["tide_dispatch_lag_milliseconds"] == 0
    assert sample["tide_dispatch_consume_queues"] == 3
    assert sample["tide_dispatch_follower_connected"] == 1
    state["running"] = dispatch_state(100, 600)
    clock.now += 2.5
    sample = cast(dict[str, Any], metrics.sample())
    assert sample["tide_dispatch_lag_bytes"] == 500
    assert sample["tide_dispatch_lag_milliseconds"] == 2500
    state["running"] = dispatch_state(600, 600)
    clock.now += 1
    assert cast(dict[str, Any], metrics.sample())["tide_dispatch_lag_milliseconds"] == 0


def test_dispatch_delay_and_timer_pending() -> None:
    running = dispatch_state(100, 100)
    sample = cast(dict[str, Any], DispatchMetrics(lambda: running, ArrivalHub()).sample())
    assert "tide_dispatch_delay_pending" not in sample  # no service, no gauge value
    assert "tide_dispatch_timer_pending" not in sample
    running.schedule = SimpleNamespace(
        state=lambda: ScheduleState((1000, 2000, 3000), True, (3, 0, 7))
    )
    running.timer = SimpleNamespace(store=SimpleNamespace(pending=42))
    sample = cast(dict[str, Any], DispatchMetrics(lambda: running, ArrivalHub()).sample())
    assert sample["tide_dispatch_delay_pending"] == [
        (3, {"level": 1}),
        (0, {"level": 2}),
        (7, {"level": 3}),
    ]
    assert sample["tide_dispatch_timer_pending"] == 42


def test_dispatch_transaction_gauges() -> None:
    running = dispatch_state(100, 100)
    sample = cast(dict[str, Any], DispatchMetrics(lambda: running, ArrivalHub()).sample())
    assert "tide_dispatch_transaction_halves_unresolved" not in sample  # no service
    running.transactions = SimpleNamespace(held=lambda: (7, 2))
    sample = cast(dict[str, Any], DispatchMetrics(lambda: running, ArrivalHub()).sample())
    assert sample["tide_dispatch_transaction_halves_unresolved"] == 7
    assert sample["tide_dispatch_transaction_halves_kept"] == 2


def test_dispatch_reports_nothing_before_it_runs() -> None:
    assert DispatchMetrics(lambda: None, ArrivalHub()).sample() == {}


def test_nameserver_counts_live_members_by_cluster_and_role() -> None:
    def live(cluster: str, name: str, broker_id: int) -> Any:
        return SimpleNamespace(cluster_name=cluster, broker_name=name, broker_id=broker_id)

    info = SimpleNamespace(
        brokers=[live("C", "broker-a", 0), live("C", "broker-a", 1), live("C", "broker-b", 0)]
    )
    routes = SimpleNamespace(cluster_info=lambda: info, topics=lambda: ["T1", "T2"])
    sample = cast(dict[str, Any], NameServerMetrics(lambda: cast(Any, routes)).sample())
    assert sample["tide_nameserver_live_brokers"] == [
        (2, {"cluster": "C", "role": "master"}),
        (1, {"cluster": "C", "role": "slave"}),
    ]
    assert sample["tide_nameserver_broker_names"] == 2
    assert sample["tide_nameserver_topics"] == 2


class FakeServicer:
    """What GatewayMetrics wraps and calls."""

    def __init__(self) -> None:
        self.committed: dict[tuple[str, str, str, int], int] = {}

    async def Produce(self, request: pb.ProduceRequest, context: Any) -> pb.ProduceResponse:
        return pb.ProduceResponse(results=[pb.ProduceResult() for _ in request.messages])

    async def Pull(self, request: pb.PullRequest, context: Any) -> pb.PullResponse:
        if request.offset >= 10:
            return pb.PullResponse(status=pb.PullResponse.NO_NEW_MESSAGE)
        if request.encoding == pb.PullRequest.ENCODING_RECORDS:  # counted, not decoded
            count = 10 - request.offset
            return pb.PullResponse(status=pb.PullResponse.FOUND, record_count=count)
        found = [storage_pb.StoredMessage()] * (10 - request.offset)
        return pb.PullResponse(status=pb.PullResponse.FOUND, messages=found)

    async def CommitOffset(self, request: pb.CommitConsumerOffsetRequest, context: Any) -> Any:
        key = (request.consumer_group, request.topic, request.broker_name, request.queue_id)
        self.committed[key] = request.offset
        return pb.CommitConsumerOffsetResponse()

    async def GetOffset(
        self, request: pb.GetConsumerOffsetRequest, context: Any
    ) -> pb.GetConsumerOffsetResponse:
        key = (request.consumer_group, request.topic, request.broker_name, request.queue_id)
        return pb.GetConsumerOffsetResponse(offset=self.committed[key])

    async def GetQueueOffsets(
        self, request: pb.QueueOffsetsRequest, context: Any
    ) -> pb.QueueOffsetsResponse:
        if request.broker_name == "gone":
            raise RuntimeError("unreachable")
        return pb.QueueOffsetsResponse(min_offset=0, max_offset=10)


def test_gateway_wrappers_count_calls_and_the_lag_scan_reports_committed_queues() -> None:
    servicer = FakeServicer()
    held = SimpleNamespace(held=4)
    metrics = GatewayMetrics(
        servicer, cast(Any, held), lambda: 0, lambda: 0, arrived_bytes=lambda: 4096
    )

    async def traffic() -> dict[str, Any]:
        produce = pb.ProduceRequest(messages=[pb.ProduceMessage(topic="T", body=b"b")] * 3)
        await servicer.Produce(produce, None)
        await servicer.Pull(pb.PullRequest(topic="T", offset=4), None)
        await servicer.Pull(pb.PullRequest(topic="T", offset=10), None)
        records = pb.PullRequest(topic="T", offset=7, encoding=pb.PullRequest.ENCODING_RECORDS)
        await servicer.Pull(records, None)
        for broker, offset in (("a", 6), ("gone", 1)):
            await servicer.CommitOffset(
                pb.CommitConsumerOffsetRequest(
                    consumer_group="g", topic="T", broker_name=broker, queue_id=1, offset=offset
                ),
                None,
            )
        return dict(await metrics._sample_lag())

    lag = asyncio.run(traffic())
    assert metrics.produced_messages == 3
    assert metrics.pulled_messages == 6 + 3
    assert metrics.pull_results == {"FOUND": 2, "NO_NEW_MESSAGE": 1}
    assert metrics._sample_held() == {
        "tide_gateway_held_pulls": 4,
        "tide_gateway_held_receives": 0,
        "tide_gateway_arrived_records_bytes": 4096,
    }
    assert lag["tide_gateway_consumer_lag_queues"] == 2
    # The unreachable broker's queue is left out of this scan.
    assert lag["tide_gateway_consumer_lag_messages"] == [
        (4, {"group": "g", "topic": "T", "broker": "a", "queue": 1})
    ]


def test_gateway_lag_scan_tracks_a_bounded_number_of_queues() -> None:
    servicer = FakeServicer()
    metrics = GatewayMetrics(servicer, cast(Any, SimpleNamespace(held=0)), lambda: 0, lambda: 0)

    async def commit_many() -> None:
        for queue in range(MAX_LAG_QUEUES + 10):
            await servicer.CommitOffset(
                pb.CommitConsumerOffsetRequest(
                    consumer_group="g", topic="T", broker_name="a", queue_id=queue, offset=0
                ),
                None,
            )

    asyncio.run(commit_many())
    assert len(metrics._committed) == MAX_LAG_QUEUES
