"""GetClusterInfo with_status: each registered member's storage and dispatch status beside
what the name servers know (BrokerLiveInfo's fields 200-206), for the web console's
cluster page, which otherwise had to scrape every storage's Prometheus endpoint."""

from __future__ import annotations

import asyncio

import grpc

from services.gateway.brokers import BrokerChannels
from tide.quoting import quote
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import storage_pb2 as storage_pb

# A member's status_error is cut here (an RPC error's details can be long).
MAX_STATUS_ERROR_CHARS = 200


async def with_status(
    info: ns_pb.ClusterInfo, channels: BrokerChannels, timeout_s: float
) -> ns_pb.ClusterInfo:
    """A copy of ``info`` (the route cache's is shared) with each member's status filled;
    the members are asked in parallel, each call bounded by ``timeout_s`` and by the
    per-address limit of ``channels``."""
    answer = ns_pb.ClusterInfo()
    answer.CopyFrom(info)
    await asyncio.gather(*(_fill(member, channels, timeout_s) for member in answer.brokers))
    return answer


async def _fill(member: ns_pb.BrokerLiveInfo, channels: BrokerChannels, timeout_s: float) -> None:
    storage, dispatch = member.address.storage, member.address.dispatch
    try:
        async with channels.limit(storage):
            status: storage_pb.StorageStatus = await channels.storage(storage).GetStatus(
                storage_pb.GetStatusRequest(), timeout=timeout_s
            )
    except grpc.aio.AioRpcError as exc:
        member.status_error = (
            f"storage {quote(storage)} GetStatus: {exc.code().name}: {exc.details()}"
        )[:MAX_STATUS_ERROR_CHARS]
    else:
        storage_figures(member, status)
    try:
        async with channels.limit(dispatch):
            delivery: dispatch_pb.DispatchStatus = await channels.dispatch(dispatch).GetStatus(
                dispatch_pb.GetDispatchStatusRequest(), timeout=timeout_s
            )
    except grpc.aio.AioRpcError:
        return  # the delay levels stay empty: the console then assumes the default table
    member.delay_levels_ms.extend(delivery.delivery.delay_levels_ms)


def storage_figures(member: ns_pb.BrokerLiveInfo, status: storage_pb.StorageStatus) -> None:
    replication = status.replication
    member.status_known = True
    member.disk_usage_ratio = status.disk_usage_ratio
    member.writable = status.writable
    if member.broker_id > 0:
        member.replication_lag_bytes = replication.lag_bytes
        member.replicas = 1 if replication.master_connected else 0
    else:
        member.replication_lag_bytes = max((s.lag_bytes for s in replication.slaves), default=0)
        member.replicas = len(replication.slaves)
