"""Route checks of a produce: an explicit queue, and why no queue is writable."""

from __future__ import annotations

import grpc

from services.gateway.routes import PERM_WRITE, QueueRef, RouteCache, TopicView
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb


async def explicit_queue(
    routes: RouteCache, index: int, message: pb.ProduceMessage, view: TopicView
) -> tuple[TopicView, QueueRef]:
    """The message's own queue, checked against the route (refreshed once when the cached
    route does not know the queue)."""
    ref = QueueRef(message.queue.broker_name, message.queue.queue_id)
    data = view.queue_data.get(ref.broker_name)
    if data is None or ref.queue_id >= data.write_queue_nums:
        view = await routes.get(message.topic, refresh=True)  # the cache may be old
        data = view.queue_data.get(ref.broker_name)
    where = f"messages[{index}].queue"
    if data is None:
        raise ServiceError(
            grpc.StatusCode.NOT_FOUND,
            f"{where}: broker {quote(ref.broker_name)} does not serve topic {quote(view.topic)} "
            f"(it is on: {', '.join(sorted(view.queue_data)) or 'no broker'})",
        )
    if ref.queue_id >= data.write_queue_nums:
        raise ServiceError(
            grpc.StatusCode.NOT_FOUND,
            f"{where}: queue_id {ref.queue_id} is out of range: topic {quote(view.topic)} has "
            f"{data.write_queue_nums} write queues on broker {quote(ref.broker_name)} "
            f"(0..{data.write_queue_nums - 1})",
        )
    if not data.perm & PERM_WRITE:
        raise ServiceError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{where}: topic {quote(view.topic)} is not writable on broker "
            f"{quote(ref.broker_name)} (perm {data.perm}); update its perm to include write (2)",
        )
    if view.master(ref.broker_name) is None:
        raise ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            f"{where}: broker {quote(ref.broker_name)} has no live master",
        )
    return view, ref


def no_writable_queue(view: TopicView) -> ServiceError:
    if not view.queue_data:
        return ServiceError(
            grpc.StatusCode.NOT_FOUND, f"topic {quote(view.topic)} has no queues on any live broker"
        )
    without_master = [name for name in sorted(view.queue_data) if view.master(name) is None]
    if len(without_master) == len(view.queue_data):
        return ServiceError(
            grpc.StatusCode.UNAVAILABLE,
            f"no broker of topic {quote(view.topic)} has a live master "
            f"({', '.join(without_master)}); retry when a broker is back",
        )
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"topic {quote(view.topic)} has no writable queue on a reachable broker (perm without "
        "write (2), or the brokers failed); update its perm or retry",
    )
