"""Channels to the brokers' storage and dispatch services: one per address, reused.

A channel is created on first use and kept; at most MAX_CHANNELS are open (the least
recently used is closed first, e.g. for brokers long gone from the routes).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

import grpc
from opentelemetry import trace

from services.gateway.append_queue import (
    DEFAULT_APPENDS_IN_FLIGHT,
    SMALL_APPENDS_IN_FLIGHT,
    UNREACHABLE,
    AppendQueue,
)
from services.gateway.append_streams import AppendStreamPool, append_stream_pool
from services.gateway.read_streams import (
    EntriesStreamPool,
    ReadStreamPool,
    entries_stream_pool,
    read_stream_pool,
)
from services.gateway.request_streams import RequestStreamPool
from tide.limits import APPEND_MAX_BYTES
from tide.server import ANSWER_FRAMING_BYTES, MAX_MESSAGE_BYTES, ServiceError, traced_channel
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import dispatch_pb2_grpc as dispatch_grpc
from tide.v1 import storage_pb2 as storage_pb
from tide.v1 import storage_pb2_grpc as storage_grpc

log = logging.getLogger("tide.gateway.brokers")

__all__ = ["UNREACHABLE", "BrokerChannels", "BrokerUnreachable", "broker_error", "rpc_problem"]

MAX_CHANNELS = 1024
# Calls in flight to one address at once (the others wait their turn): a burst of woken
# pulls must not overflow the broker's gRPC pending-request queue (it cancels past it).
MAX_CALLS_PER_ADDRESS = 128
CHANNEL_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES + ANSWER_FRAMING_BYTES),
    # An Append carries the records of a whole Produce: more than the Produce (tide.limits)
    ("grpc.max_send_message_length", APPEND_MAX_BYTES),
    # Reconnect soon after a broker comes back, not after gRPC's default backoff (up to 2 min).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)
# Broker answers passed on to the gateway's caller with the same code.
PASSED_THROUGH = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
    }
)


class BrokerUnreachable(ServiceError):
    """A broker call that could not reach the service (UNAVAILABLE, DEADLINE_EXCEEDED,
    CANCELLED): the caller may try another member of the broker (reads) or another broker
    (produce). Its gRPC status is UNAVAILABLE."""

    def __init__(self, message: str) -> None:
        super().__init__(grpc.StatusCode.UNAVAILABLE, message)


def rpc_problem(exc: grpc.aio.AioRpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"


def broker_error(exc: grpc.aio.AioRpcError, what: str) -> ServiceError:
    """The gateway's status for a failed broker call. ``what`` names the call and the
    broker, e.g. ``"Read on broker b1 (127.0.0.1:10911)"``."""
    code = exc.code()
    if code in PASSED_THROUGH:
        return ServiceError(code, f"{what}: {exc.details()}")
    if code in UNREACHABLE:
        return BrokerUnreachable(f"{what} failed: {rpc_problem(exc)}; is the broker up?")
    return ServiceError(grpc.StatusCode.INTERNAL, f"{what} failed: {rpc_problem(exc)}")


class BrokerChannels:
    def __init__(self, appends_in_flight: int = DEFAULT_APPENDS_IN_FLIGHT) -> None:
        """``appends_in_flight``: Appends to one storage at once (AppendQueue), each on
        its own AppendStream."""
        self._appends_in_flight = appends_in_flight
        self._channels: OrderedDict[str, grpc.aio.Channel] = OrderedDict()
        self._storage: dict[str, storage_grpc.StorageAsyncStub] = {}
        self._dispatch: dict[str, dispatch_grpc.DispatchAsyncStub] = {}
        self._limits: dict[str, asyncio.Semaphore] = {}
        self._appends: dict[str, AppendQueue] = {}
        self._streams: dict[str, AppendStreamPool] = {}
        self._reads: dict[str, ReadStreamPool] = {}
        self._entries: dict[str, EntriesStreamPool] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def limit(self, address: str) -> asyncio.Semaphore:
        """Hold while calling ``address``: at most MAX_CALLS_PER_ADDRESS calls at once."""
        limit = self._limits.get(address)
        if limit is None:
            limit = self._limits[address] = asyncio.Semaphore(MAX_CALLS_PER_ADDRESS)
        return limit

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is not None:
            self._channels.move_to_end(address)
            return channel
        channel = traced_channel(address, options=CHANNEL_OPTIONS)  # carries trace context
        self._channels[address] = channel
        while len(self._channels) > MAX_CHANNELS:
            old_address, old = self._channels.popitem(last=False)
            self._storage.pop(old_address, None)
            self._dispatch.pop(old_address, None)
            self._limits.pop(old_address, None)
            self._appends.pop(old_address, None)
            self._close_pools(old_address)
            log.info("closing the channel to %s (least recently used)", old_address)
            task = asyncio.ensure_future(old.close(None))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
        return channel

    def storage(self, address: str) -> storage_grpc.StorageAsyncStub:
        stub = self._storage.get(address)
        if stub is None:
            stub = self._storage[address] = storage_grpc.StorageStub(self._channel(address))
        return stub

    def appends(self, address: str) -> AppendQueue:
        """The coalescing Append queue of the storage at ``address``. Its calls go over
        the address's AppendStream pool (as many streams as call slots), except in a
        sampled trace: a stream carries no trace context per request, so those use the
        unary Append and the storage's spans stay in the produce's trace."""
        queue = self._appends.get(address)
        if queue is None:
            channel = self._channel(address)
            call = channel.unary_unary(
                "/tide.v1.Storage/Append",
                request_serializer=None,  # requests arrive serialized
                response_deserializer=storage_pb.AppendResponse.FromString,
            )
            # a stream per call slot, the small groups' included (append_queue.py)
            slots = self._appends_in_flight + SMALL_APPENDS_IN_FLIGHT
            streams = append_stream_pool(channel, address, slots)
            self._streams[address] = streams

            async def append(data: bytes, timeout_s: float) -> storage_pb.AppendResponse:
                if trace.get_current_span().is_recording():
                    response: storage_pb.AppendResponse = await call(data, timeout=timeout_s)
                    return response
                return await streams.call(data, timeout_s)

            queue = AppendQueue(
                append,
                self.limit(address),
                max_in_flight=self._appends_in_flight,
                small_in_flight=SMALL_APPENDS_IN_FLIGHT,
            )
            self._appends[address] = queue
        return queue

    def append_streams(self, address: str) -> AppendStreamPool | None:
        """The AppendStream pool of ``address`` (None before its first append)."""
        return self._streams.get(address)

    async def read(
        self, address: str, request: storage_pb.ReadRequest, timeout_s: float
    ) -> storage_pb.ReadResponse:
        """``Storage.Read`` on ``address``, over its ReadStream pool (read_streams.py)
        except in a sampled trace (as :meth:`appends`); raises ``AioRpcError``."""
        if trace.get_current_span().is_recording():
            response: storage_pb.ReadResponse = await self.storage(address).Read(
                request, timeout=timeout_s
            )
            return response
        pool = self._reads.get(address)
        if pool is None:
            pool = self._reads[address] = read_stream_pool(self._channel(address), address)
        return await pool.call(request, timeout_s)

    async def queue_entries(
        self, address: str, request: dispatch_pb.GetQueueEntriesRequest, timeout_s: float
    ) -> dispatch_pb.GetQueueEntriesResponse:
        """``Dispatch.GetQueueEntries`` on ``address``, over its GetQueueEntriesStream
        pool except in a sampled trace (as :meth:`read`); raises ``AioRpcError``."""
        if trace.get_current_span().is_recording():
            response: dispatch_pb.GetQueueEntriesResponse = await self.dispatch(
                address
            ).GetQueueEntries(request, timeout=timeout_s)
            return response
        pool = self._entries.get(address)
        if pool is None:
            pool = self._entries[address] = entries_stream_pool(self._channel(address), address)
        return await pool.call(request, timeout_s)

    def read_streams(self, address: str) -> ReadStreamPool | None:
        """The ReadStream pool of ``address`` (None before its first streamed read)."""
        return self._reads.get(address)

    def entries_streams(self, address: str) -> EntriesStreamPool | None:
        """The GetQueueEntriesStream pool of ``address`` (None before its first use)."""
        return self._entries.get(address)

    def _close_pools(self, address: str) -> None:
        pools: tuple[RequestStreamPool[Any, Any, Any] | None, ...] = (
            self._streams.pop(address, None),
            self._reads.pop(address, None),
            self._entries.pop(address, None),
        )
        for pool in pools:
            if pool is not None:
                pool.close()

    def connected(self, address: str) -> bool:
        """Whether the channel to ``address`` is connected now (READY). Asking also starts a
        reconnection attempt when the channel is idle or failed."""
        state = self._channel(address).get_state(try_to_connect=True)
        return state is grpc.ChannelConnectivity.READY

    def dispatch(self, address: str) -> dispatch_grpc.DispatchAsyncStub:
        stub = self._dispatch.get(address)
        if stub is None:
            stub = self._dispatch[address] = dispatch_grpc.DispatchStub(self._channel(address))
        return stub

    async def close(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        self._storage.clear()
        self._dispatch.clear()
        self._appends.clear()
        for address in {*self._streams, *self._reads, *self._entries}:
            self._close_pools(address)
        for channel in channels:
            await channel.close(None)
        if self._closing:
            await asyncio.gather(*self._closing)
