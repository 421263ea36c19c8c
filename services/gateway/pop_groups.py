"""Whether a POP group consumes in order (GroupConfig.consume_message_orderly: RocketMQ 5
takes ``fifo`` from the group), from the storage of a broker serving the topic, cached
for CACHE_TTL_S. A broker that cannot answer counts as not orderly (logged once)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import grpc

from services.gateway.brokers import BrokerChannels, rpc_problem
from services.gateway.routes import Member
from tide.quoting import quote
from tide.v1 import storage_pb2 as storage_pb

log = logging.getLogger("tide.gateway.pop")

CACHE_TTL_S = 5.0
MAX_CACHED_GROUPS = 100_000


class PopGroups:
    def __init__(self, channels: BrokerChannels, timeout_s: float) -> None:
        self._channels = channels
        self._timeout_s = timeout_s
        self._orderly: dict[str, tuple[float, bool]] = {}  # group -> (expires at, orderly)

    async def orderly(self, group: str, masters: Sequence[tuple[Member, list[int]]]) -> bool:
        cached = self._orderly.get(group)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        orderly = False
        for master, _ in masters:
            try:
                answer: storage_pb.GetGroupResponse = await self._channels.storage(
                    master.storage
                ).GetGroup(storage_pb.GetGroupRequest(group=group), timeout=self._timeout_s)
            except grpc.aio.AioRpcError as exc:
                log.warning(
                    "group %s config unknown on %s (%s): delivered as not orderly",
                    quote(group),
                    master.broker_name,
                    rpc_problem(exc),
                )
                continue
            orderly = answer.found and answer.group.consume_message_orderly
            break
        if len(self._orderly) >= MAX_CACHED_GROUPS:
            self._orderly.clear()
        self._orderly[group] = (time.monotonic() + CACHE_TTL_S, orderly)
        return orderly
