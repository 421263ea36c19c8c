"""What a Receive needs of its group's config, from the storage of a broker serving the
topic, cached for CACHE_TTL_S: whether it consumes in order
(GroupConfig.consume_message_orderly: RocketMQ 5 takes ``fifo`` from the group) and
whether it may consume at all (consume_enable false: FAILED_PRECONDITION, as a Pull's
consume gate). A broker that cannot answer counts as enabled, not orderly (logged)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import grpc

from services.gateway.brokers import BrokerChannels, rpc_problem
from services.gateway.routes import Member
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import storage_pb2 as storage_pb

log = logging.getLogger("tide.gateway.pop")

CACHE_TTL_S = 5.0
MAX_CACHED_GROUPS = 100_000


class PopGroups:
    def __init__(self, channels: BrokerChannels, timeout_s: float) -> None:
        self._channels = channels
        self._timeout_s = timeout_s
        # group -> (expires at, orderly, enabled)
        self._groups: dict[str, tuple[float, bool, bool]] = {}

    async def orderly(self, group: str, masters: Sequence[tuple[Member, list[int]]]) -> bool:
        """Whether ``group`` consumes in order; FAILED_PRECONDITION when it may not consume."""
        cached = self._groups.get(group)
        if cached is None or cached[0] <= time.monotonic():
            cached = await self._fetch(group, masters)
        if not cached[2]:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"consumer group {quote(group)} may not consume: its config has consume_enable "
                f"false (`tide group update {group} --consume-enable` allows it again)",
            )
        return cached[1]

    async def _fetch(
        self, group: str, masters: Sequence[tuple[Member, list[int]]]
    ) -> tuple[float, bool, bool]:
        orderly, enabled = False, True
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
            enabled = not answer.found or answer.group.consume_enable
            break
        if len(self._groups) >= MAX_CACHED_GROUPS:
            self._groups.clear()
        cached = self._groups[group] = (time.monotonic() + CACHE_TTL_S, orderly, enabled)
        return cached
