"""The gateway's metrics, recorded by wrapping the servicer's handlers (once per call,
never per message: totals are plain numbers reported by observable counters, the produce
latency is one histogram record), and its trace attributes.

* ``tide_gateway_produced_messages_total``, ``tide_gateway_produced_bytes_total`` (the
  commitlog records written), ``tide_gateway_produce_latency_seconds``: Produce calls and
  ProduceStream requests alike (one latency record per request);
* ``tide_gateway_produce_stream_errors_total{code}``: ProduceStream requests answered with
  an in-band error (a failed Produce call is counted by the interceptor, below);
  ``tide_gateway_produce_streams`` (open now);
* ``tide_gateway_produce_in_flight_bytes`` (bytes of the produce requests being processed
  now, bounded by ``max_produce_in_flight_bytes``), ``..._peak_bytes`` (the most at once
  since start), ``tide_gateway_produce_refused_total`` (requests refused
  RESOURCE_EXHAUSTED by that limit);
* ``tide_gateway_pull_results_total{status}``, ``tide_gateway_pulled_messages_total``;
* ``tide_gateway_send_back_total{group,outcome}``: SendBack calls that stored a retry
  (``outcome="retry"``) or a dead letter (``"dlq"``), per consumer group (at most
  send_back.MAX_COUNTED_GROUPS groups by name, the rest as ``"other"``);
* ``tide_gateway_held_pulls`` (long polls waiting now: a held POP Receive counts once per
  queue it watches), ``tide_gateway_held_receives`` (POP Receives held now, at most
  ``--max-held-receives``),
  ``tide_gateway_pulls_answered_from_arrivals_total`` (held pulls answered with the
  entries and records their arrival notice carried, without a GetQueueEntries call),
  ``tide_gateway_pulls_held_at_end_total`` (records pulls held before reading: the
  arrival notices had announced their offset as the queue's max),
  ``tide_gateway_pulls_held_for_min_messages_total`` (pulls held for their
  ``min_messages`` before reading: the queue had fewer past their offset);
* ``tide_gateway_consumer_lag_messages{group,topic,broker,queue}``: for the queues whose
  offsets a group committed through this gateway (at most ``MAX_LAG_QUEUES``, forgotten
  after ``LAG_FORGET_S`` without a commit), max offset - committed offset, scanned every
  ``LAG_SCAN_INTERVAL_S`` with the gateway's own GetOffset / GetQueueOffsets;
* ordering and transactions: ``tide_gateway_pulls_refused_total{reason}`` (pulls refused
  FAILED_PRECONDITION: ``queue_locked``, another member holds the queue's lock;
  ``consume_disabled``, the group's config has consume_enable false),
  ``tide_gateway_transaction_halves_total`` (transactional messages stored as half
  messages), ``tide_gateway_transaction_checks_sent_total`` (check-backs sent on
  producers' TransactionChecks streams);
* errors by method and status code: ``tide_gateway_rpc_errors_total`` (the server
  interceptor, as for every service).

Instruments are created in :meth:`GatewayMetrics.start`, once telemetry is configured;
before that the wrappers only pass the calls through.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Histogram, Meter, Observation

from services.gateway.long_poll import HeldPulls
from services.gateway.produce_stream import ProduceOne, ProduceStreams
from tide.server import ByteBudget, ServiceError
from tide.server._metrics import (
    LATENCY_BUCKETS_S,
    Attributes,
    Sample,
    SampledGauges,
    observable_total,
    service_meter,
)
from tide.server._telemetry import TRACING
from tide.v1 import gateway_pb2 as pb

MAX_LAG_QUEUES = 512
LAG_SCAN_INTERVAL_S = 10.0
LAG_FORGET_S = 600.0
LAG_CALL_CONCURRENCY = 8

_PULL_STATUS_NAMES = {number: name for name, number in pb.PullResponse.Status.items() if number}

LagKey = tuple[str, str, str, int]  # (group, topic, broker, queue id)


@dataclass(frozen=True)
class OrderingTotals:
    """Readers of the ordering and transaction totals their owners keep."""

    refused_pulls: Callable[[], dict[str, int]]  # by reason
    halves_stored: Callable[[], int]
    checks_sent: Callable[[], int]


Handler = Callable[[Any, Any], Awaitable[Any]]


class GatewayMetrics:
    def __init__(
        self,
        servicer: Any,
        held: HeldPulls,
        written_bytes: Callable[[], int],
        arrival_answers: Callable[[], int],
        streams: ProduceStreams | None = None,
        pull_budget: ByteBudget | None = None,
        send_backs: Callable[[], dict[tuple[str, str], int]] | None = None,
        ordering: OrderingTotals | None = None,
        held_receives: Callable[[], int] = lambda: 0,
        arrived_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        """Wrap ``servicer``'s Produce, Pull and CommitOffset (before it is registered)
        and the request handler of ``streams`` (its ProduceStream calls); ``written_bytes``
        gives the record bytes the produces wrote so far, ``arrival_answers`` the pulls
        answered from the records arrival notices carried, ``arrived_bytes`` how many
        such record bytes the gateway keeps (arrived.py)."""
        self._held = held
        self._streams = streams
        self._pull_budget = pull_budget
        self._written_bytes = written_bytes
        self._arrival_answers = arrival_answers
        self._send_backs = send_backs
        self._ordering = ordering
        self._held_receives = held_receives
        self._arrived_bytes = arrived_bytes
        self._get_offset: Handler = servicer.GetOffset
        self._queue_offsets: Handler = servicer.GetQueueOffsets
        self._produce_latency: Histogram | None = None
        # Totals, updated on the event loop only.
        self.produced_messages = 0
        self.pulled_messages = 0
        self.pull_results: dict[str, int] = {}
        self.stream_errors: dict[str, int] = {}  # status code name -> in-band errors
        self._committed: dict[LagKey, float] = {}  # -> monotonic time of the last commit
        self._gauges: list[SampledGauges] = []
        servicer.Produce = self._wrap_produce(servicer.Produce)
        servicer.Pull = self._wrap_pull(servicer.Pull)
        if streams is not None:
            streams.produce = self._wrap_stream_produce(streams.produce)
        servicer.CommitOffset = self._wrap_commit(servicer.CommitOffset)

    def start(self) -> None:
        meter = service_meter("gateway")
        observable_total(
            meter,
            "tide_gateway_produced_messages_total",
            lambda: self.produced_messages,
            "messages produced",
        )
        observable_total(
            meter,
            "tide_gateway_produced_bytes_total",
            self._written_bytes,
            "bytes of the commitlog records produced",
            unit="By",
        )
        observable_total(
            meter,
            "tide_gateway_produce_stream_errors_total",
            lambda: self.stream_errors,
            "ProduceStream requests answered with an error, by status code",
            label="code",
        )
        observable_total(
            meter,
            "tide_gateway_produce_refused_total",
            lambda: self._streams.budget.refused if self._streams else 0,
            "produce requests refused RESOURCE_EXHAUSTED by max_produce_in_flight_bytes",
        )
        observable_total(
            meter,
            "tide_gateway_pull_results_total",
            lambda: self.pull_results,
            "Pull answers by status",
            label="status",
        )
        observable_total(
            meter,
            "tide_gateway_pulled_messages_total",
            lambda: self.pulled_messages,
            "messages pulled",
        )
        observable_total(
            meter,
            "tide_gateway_pulls_answered_from_arrivals_total",
            self._arrival_answers,
            "records pulls answered from the records arrival notices carried (no "
            "GetQueueEntries call)",
        )
        observable_total(
            meter,
            "tide_gateway_pulls_held_at_end_total",
            lambda: self._held.end_waits,
            "records pulls held before reading: the arrival notices had announced their "
            "offset as the queue's max",
        )
        observable_total(
            meter,
            "tide_gateway_pulls_held_for_min_messages_total",
            lambda: self._held.filled_waits,
            "pulls held for their min_messages before reading (the queue had fewer past "
            "the pull's offset)",
        )
        if self._send_backs is not None:
            send_back_total(meter, self._send_backs)
        if self._ordering is not None:
            _ordering_totals(meter, self._ordering)
        self._produce_latency = meter.create_histogram(
            "tide_gateway_produce_latency_seconds",
            unit="s",
            description="Produce call (or ProduceStream request) latency (all the storage "
            "appends it waited for)",
            explicit_bucket_boundaries_advisory=list(LATENCY_BUCKETS_S),
        )
        held = SampledGauges(meter, self._sample_held)
        held.gauge("tide_gateway_held_pulls", "long polls held now")
        held.gauge("tide_gateway_held_receives", "POP Receives held now (--max-held-receives)")
        held.gauge(
            "tide_gateway_arrived_records_bytes",
            "record bytes kept from arrival notices for the pulls after them "
            "(--max-arrived-records-bytes)",
        )
        streams = SampledGauges(meter, self._sample_streams)
        streams.gauge("tide_gateway_produce_streams", "ProduceStream calls open now")
        streams.gauge(
            "tide_gateway_produce_in_flight_bytes",
            "bytes of the produce requests being processed now (max_produce_in_flight_bytes)",
            unit="By",
        )
        streams.gauge(
            "tide_gateway_produce_in_flight_peak_bytes",
            "the most bytes of produce requests processed at once since start",
            unit="By",
        )
        pulls = SampledGauges(meter, self._sample_pulls)
        pulls.gauge(
            "tide_gateway_pull_in_flight_bytes",
            "bytes counted for the Pull answers being read now (max_pull_in_flight_bytes)",
            unit="By",
        )
        pulls.gauge(
            "tide_gateway_pull_in_flight_peak_bytes",
            "the most bytes counted for Pull answers being read at once since start",
            unit="By",
        )

        lag = SampledGauges(meter, self._sample_lag, LAG_SCAN_INTERVAL_S)
        lag.gauge(
            "tide_gateway_consumer_lag_messages",
            "max offset - committed offset per group and queue (groups that committed here)",
        )
        lag.gauge("tide_gateway_consumer_lag_queues", "queues the consumer lag scan covers")
        self._gauges = [held, streams, pulls, lag]
        for gauges in self._gauges:
            gauges.start()

    async def stop(self) -> None:
        for gauges in self._gauges:
            await gauges.stop()

    # -- wrappers ----------------------------------------------------------------
    def _wrap_produce(self, produce: Handler) -> Handler:
        async def Produce(request: pb.ProduceRequest, context: Any) -> pb.ProduceResponse:
            started = time.perf_counter()
            count = len(request.messages)
            if TRACING.enabled and count:
                first = request.messages[0]
                _name_span(
                    {
                        "messaging.destination.name": first.topic,
                        "messaging.batch.message_count": count,
                    }
                )
            response: pb.ProduceResponse = await produce(request, context)
            latency = self._produce_latency
            if latency is not None:
                latency.record(time.perf_counter() - started)
            self.produced_messages += count
            return response

        return Produce

    def _wrap_stream_produce(self, produce: ProduceOne) -> ProduceOne:
        """One ProduceStream request: as a Produce call (no span of its own: the stream
        has one), and its in-band error counted."""

        async def produce_one(
            request: pb.ProduceRequest, peer: str, request_bytes: int, wire: bytes | None
        ) -> pb.ProduceResponse:
            started = time.perf_counter()
            try:
                response = await produce(request, peer, request_bytes, wire)
            except ServiceError as exc:
                name = exc.code.name
                self.stream_errors[name] = self.stream_errors.get(name, 0) + 1
                raise
            latency = self._produce_latency
            if latency is not None:
                latency.record(time.perf_counter() - started)
            self.produced_messages += len(request.messages)
            return response

        return produce_one

    def _wrap_pull(self, pull: Handler) -> Handler:
        async def Pull(request: pb.PullRequest, context: Any) -> pb.PullResponse:
            if TRACING.enabled:
                _name_span(
                    {
                        "messaging.destination.name": request.topic,
                        "messaging.consumer.group.name": request.consumer_group,
                        "messaging.tide.broker_name": request.broker_name,
                        "messaging.tide.queue_id": request.queue_id,
                    }
                )
            response: pb.PullResponse = await pull(request, context)
            status = _PULL_STATUS_NAMES.get(response.status, "UNKNOWN")
            self.pull_results[status] = self.pull_results.get(status, 0) + 1
            self.pulled_messages += len(response.messages) or response.record_count
            return response

        return Pull

    def _wrap_commit(self, commit: Handler) -> Handler:
        async def CommitOffset(request: pb.CommitConsumerOffsetRequest, context: Any) -> Any:
            response = await commit(request, context)
            key = (request.consumer_group, request.topic, request.broker_name, request.queue_id)
            if key in self._committed or len(self._committed) < MAX_LAG_QUEUES:
                self._committed[key] = time.monotonic()
            return response

        return CommitOffset

    # -- gauges ------------------------------------------------------------------
    def _sample_held(self) -> Sample:
        return {
            "tide_gateway_held_pulls": self._held.held,
            "tide_gateway_held_receives": self._held_receives(),
            "tide_gateway_arrived_records_bytes": self._arrived_bytes(),
        }

    def _sample_pulls(self) -> Sample:
        budget = self._pull_budget
        if budget is None:
            return {}
        return {
            "tide_gateway_pull_in_flight_bytes": budget.in_use_bytes,
            "tide_gateway_pull_in_flight_peak_bytes": budget.peak_bytes,
        }

    def _sample_streams(self) -> Sample:
        streams = self._streams
        if streams is None:
            return {"tide_gateway_produce_streams": 0}
        budget = streams.budget
        return {
            "tide_gateway_produce_streams": streams.open_streams,
            "tide_gateway_produce_in_flight_bytes": budget.in_use_bytes,
            "tide_gateway_produce_in_flight_peak_bytes": budget.peak_bytes,
        }

    async def _sample_lag(self) -> Sample:
        now = time.monotonic()
        for key in [k for k, at in self._committed.items() if now - at > LAG_FORGET_S]:
            del self._committed[key]
        keys = sorted(self._committed)
        limit = asyncio.Semaphore(LAG_CALL_CONCURRENCY)
        lags = await asyncio.gather(*(self._lag(key, limit) for key in keys))
        points: list[tuple[float | int, Attributes]] = [
            (lag, {"group": group, "topic": topic, "broker": broker, "queue": queue})
            for (group, topic, broker, queue), lag in zip(keys, lags, strict=True)
            if lag is not None
        ]
        return {
            "tide_gateway_consumer_lag_messages": points,
            "tide_gateway_consumer_lag_queues": len(keys),
        }

    async def _lag(self, key: LagKey, limit: asyncio.Semaphore) -> int | None:
        group, topic, broker, queue = key
        async with limit:
            try:
                committed = await self._get_offset(
                    pb.GetConsumerOffsetRequest(
                        consumer_group=group, topic=topic, broker_name=broker, queue_id=queue
                    ),
                    None,
                )
                offsets = await self._queue_offsets(
                    pb.QueueOffsetsRequest(topic=topic, broker_name=broker, queue_id=queue),
                    None,
                )
            except Exception:  # unreachable now (or gone): left out of this scan
                return None
        return max(0, int(offsets.max_offset) - max(int(committed.offset), 0))


def _name_span(attributes: dict[str, str | int]) -> None:
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(attributes)


def send_back_total(meter: Meter, totals: Callable[[], dict[tuple[str, str], int]]) -> None:
    """``tide_gateway_send_back_total{group,outcome}`` from the send-backs' totals."""

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [
            Observation(count, {"group": group, "outcome": outcome})
            for (group, outcome), count in list(totals().items())
        ]

    meter.create_observable_counter(
        "tide_gateway_send_back_total",
        callbacks=[observe],
        unit="1",
        description="messages sent back by consumers: stored for a retry or dead-lettered",
    )


def _ordering_totals(meter: Meter, totals: OrderingTotals) -> None:
    observable_total(
        meter,
        "tide_gateway_pulls_refused_total",
        totals.refused_pulls,
        "pulls refused FAILED_PRECONDITION: queue_locked (another member holds the queue's "
        "lock), consume_disabled (the group's consume_enable is false)",
        label="reason",
    )
    observable_total(
        meter,
        "tide_gateway_transaction_halves_total",
        totals.halves_stored,
        "transactional messages stored as half messages",
    )
    observable_total(
        meter,
        "tide_gateway_transaction_checks_sent_total",
        totals.checks_sent,
        "transaction check-backs sent on producers' TransactionChecks streams",
    )
