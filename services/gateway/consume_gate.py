"""Pulls of a group whose config says ``consume_enable = false`` are refused (RocketMQ's
PullMessageProcessor answers NO_PERMISSION: "subscription group no permission"); here
FAILED_PRECONDITION, gateway.proto's status for a queue one may not read.

Group configs live in each broker's storage (docs/delivery.md, "Consumer group
configs"), so the gate asks the broker a pull reads from and keeps the answer for
``CACHE_TTL_S``: a pull costs a dict look-up, and a change reaches the gateways within
that time. A broker that cannot answer (down, or a storage from before group configs)
does not stop consumption: the pull goes on as enabled, and the failure is logged once
per broker.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence

import grpc

from services.gateway.brokers import BrokerChannels
from services.gateway.routes import Member
from tide.quoting import quote
from tide.server import ServiceError
from tide.single_flight import SingleFlight
from tide.v1 import storage_pb2 as storage_pb

log = logging.getLogger("tide.gateway.consume_gate")

CACHE_TTL_S = 5.0
MAX_CACHED_GROUPS = 100_000  # (broker, group) answers kept; the oldest go first
_Key = tuple[str, str]  # (broker name, group)


class ConsumeGate:
    def __init__(self, channels: BrokerChannels, timeout_s: float) -> None:
        self._channels = channels
        self._timeout_s = timeout_s
        # (broker, group) -> (expires at, monotonic s; consume enabled), oldest first.
        self._answers: OrderedDict[_Key, tuple[float, bool]] = OrderedDict()
        self._fetching: SingleFlight[_Key, bool] = SingleFlight("group-config")
        self._failing: set[str] = set()  # brokers whose failure was logged
        self.refused = 0  # a metric (tide_gateway_pulls_refused_total)

    async def check(self, group: str, broker_name: str, members: Sequence[Member]) -> None:
        """Raise FAILED_PRECONDITION when ``group`` may not consume on the broker."""
        if not group:
            return
        key = (broker_name, group)
        answer = self._answers.get(key)
        if answer is not None and answer[0] > time.monotonic():
            enabled = answer[1]
        else:
            enabled = await self._fetch_shared(key, members)
        if not enabled:
            self.refused += 1
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"consumer group {quote(group)} may not consume on broker "
                f"{quote(broker_name)}: its config has consume_enable false (`tide group "
                f"update {group} --consume-enable` allows it again)",
            )

    async def _fetch_shared(self, key: _Key, members: Sequence[Member]) -> bool:
        """One GetGroup per (broker, group) at a time, however many pulls wait for it
        (tide.single_flight: a pull that goes away does not cancel it for the others)."""
        return await self._fetching.run(key, lambda: self._fetch_and_keep(key, members))

    async def _fetch_and_keep(self, key: _Key, members: Sequence[Member]) -> bool:
        enabled = await self._fetch(key, members)
        self._answers[key] = (time.monotonic() + CACHE_TTL_S, enabled)
        self._answers.move_to_end(key)
        while len(self._answers) > MAX_CACHED_GROUPS:
            self._answers.popitem(last=False)
        return enabled

    async def _fetch(self, key: _Key, members: Sequence[Member]) -> bool:
        broker_name, group = key
        request = storage_pb.GetGroupRequest(group=group)
        for member in members:  # the master first, then the slaves (they serve reads)
            try:
                answer: storage_pb.GetGroupResponse = await self._channels.storage(
                    member.storage
                ).GetGroup(request, timeout=self._timeout_s)
            except grpc.aio.AioRpcError as exc:
                if broker_name not in self._failing:
                    self._failing.add(broker_name)
                    log.warning(
                        "cannot read group configs of broker %s (%s): %s; pulls go on as if "
                        "consume were enabled",
                        broker_name,
                        member.storage,
                        exc.code().name,
                    )
                continue
            self._failing.discard(broker_name)
            return answer.group.consume_enable
        return True
