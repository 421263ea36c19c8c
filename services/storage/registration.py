"""Broker registration (RocketMQ's registerBrokerAll): the storage tells every name server
who it is and its whole topic table.

It registers at start, whenever the topic table changes (upsert, delete, auto-create),
and every register interval. Each name server has its own link (channel, task, retry
backoff), so a slow or dead one never delays the others; every call has a timeout
(``--register-timeout-ms``).
Failures are logged with the name server's address and retried (after 1 s, doubling up
to the register interval). On stop the links end and the broker unregisters from each
name server, all at once, within that timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from services.storage import convert
from services.storage.engine.topic_table import DataVersion, TopicChange, TopicTable
from tide.server import cluster_channel_interceptors
from tide.v1 import nameserver_pb2 as pb
from tide.v1 import nameserver_pb2_grpc as pb_grpc

log = logging.getLogger("tide.storage.registration")

FIRST_RETRY_S = 1.0
MAX_NAME_SERVERS = 32
CHANNEL_OPTIONS = [("grpc.max_send_message_length", 64 * 1024 * 1024)]


@dataclass(frozen=True, slots=True)
class BrokerIdentity:
    cluster_name: str
    broker_name: str
    broker_id: int
    storage_address: str
    dispatch_address: str
    heartbeat_timeout_ms: int


def parse_name_servers(text: str) -> list[str]:
    """RocketMQ's namesrvAddr: ``host:port;host:port`` (empty entries ignored)."""
    return [part.strip() for part in text.split(";") if part.strip()]


class _Link:
    """Registration with one name server."""

    def __init__(self, address: str, registrar: BrokerRegistrar, timeout_s: float) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._registrar = registrar
        self._channel = grpc.aio.insecure_channel(
            address, options=CHANNEL_OPTIONS, interceptors=cluster_channel_interceptors() or None
        )
        self._stub = pb_grpc.NameServerStub(self._channel)
        self.wake = asyncio.Event()
        self.wake.set()  # register at once
        self.registered = False
        self.failures = 0
        self.task: asyncio.Task[None] | None = None

    async def run(self, interval_s: float) -> None:
        delay_s = 0.0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), delay_s or None)
            self.wake.clear()
            try:
                ok = await self.register()
            except Exception:
                ok = False
                self.failures += 1
                log.exception("registering with name server %s failed", self.address)
            if ok:
                delay_s = interval_s
            else:
                delay_s = min(interval_s, FIRST_RETRY_S * 2 ** min(self.failures - 1, 16))

    async def register(self) -> bool:
        request = self._registrar.request()
        try:
            await self._stub.RegisterBroker(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            self.failures += 1
            self.registered = False
            log.warning(
                "cannot register with name server %s (attempt %d): %s: %s",
                self.address,
                self.failures,
                exc.code().name,
                exc.details(),
            )
            return False
        if not self.registered:
            log.info(
                "registered with name server %s: %d topics, data version %d",
                self.address,
                len(request.topics),
                request.data_version.counter,
            )
        self.registered, self.failures = True, 0
        return True

    async def unregister(self, request: pb.UnregisterBrokerRequest) -> None:
        try:
            reply = await self._stub.UnregisterBroker(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as exc:
            log.warning(
                "cannot unregister from name server %s: %s: %s (it drops this broker "
                "after its heartbeat timeout)",
                self.address,
                exc.code().name,
                exc.details(),
            )
            return
        log.info("unregistered from name server %s (existed: %s)", self.address, reply.existed)

    async def close(self) -> None:
        await self._channel.close(None)


class BrokerRegistrar:
    """Created and used on the service's event loop; :meth:`topics_changed` may be
    called from any thread."""

    def __init__(
        self,
        identity: BrokerIdentity,
        name_servers: Sequence[str],
        topics: TopicTable,
        *,
        register_interval_ms: int,
        call_timeout_ms: int,
    ) -> None:
        self.identity = identity
        self._topics = topics
        self._interval_s = register_interval_ms / 1000
        self._loop = asyncio.get_running_loop()
        timeout_s = call_timeout_ms / 1000
        self._links = [_Link(address, self, timeout_s) for address in name_servers]
        self._stopping = False
        self._wake_pending = False  # a _wake_all is scheduled and has not run yet
        self._request: tuple[DataVersion, pb.RegisterBrokerRequest] | None = None
        self._unregistering: asyncio.Task[None] | None = None

    def start(self) -> None:
        for link in self._links:
            link.task = asyncio.ensure_future(link.run(self._interval_s))
        self._topics.add_listener(self._on_topic_change)
        log.info(
            "registering %s/%s id %d (%s) with %d name server(s): %s",
            self.identity.cluster_name,
            self.identity.broker_name,
            self.identity.broker_id,
            self.identity.storage_address,
            len(self._links),
            ", ".join(link.address for link in self._links),
        )

    def request(self) -> pb.RegisterBrokerRequest:
        """The registration as of now: the whole topic table and its data version (built
        once per data version, shared by the links)."""
        version = self._topics.data_version
        cached = self._request
        if cached is None or cached[0] != version:
            cached = self._request = (version, self._build_request(version))
        return cached[1]

    def _build_request(self, version: DataVersion) -> pb.RegisterBrokerRequest:
        """Topics listed after ``version`` was read: never older than the version says (a
        change in between triggers another registration anyway)."""
        identity = self.identity
        topics = self._topics.list()
        timestamp_ms, counter = version
        return pb.RegisterBrokerRequest(
            cluster_name=identity.cluster_name,
            broker_name=identity.broker_name,
            broker_id=identity.broker_id,
            address=pb.BrokerAddress(
                storage=identity.storage_address, dispatch=identity.dispatch_address
            ),
            topics=[convert.topic_to_pb(cfg) for cfg in topics],
            data_version=pb.DataVersion(timestamp_ms=timestamp_ms, counter=counter),
            heartbeat_timeout_ms=identity.heartbeat_timeout_ms,
        )

    def registered_with(self) -> list[str]:
        return [link.address for link in self._links if link.registered]

    def _on_topic_change(self, change: TopicChange) -> None:
        """A topic table listener (any thread): register again with every name server."""
        if self._stopping or self._wake_pending:
            return  # one wake-up covers every change before it runs (a slave's sync
            # installing a whole table reports each topic)
        self._wake_pending = True
        self._loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        self._wake_pending = False
        for link in self._links:
            link.wake.set()

    def begin_stop(self) -> None:
        """Stop registering and start unregistering from every name server (on the loop)."""
        if self._unregistering is None:
            self._stopping = True
            self._unregistering = asyncio.ensure_future(self._unregister_all())

    async def stop(self) -> None:
        """End the links after unregistering from every name server (bounded time)."""
        self.begin_stop()
        assert self._unregistering is not None
        await self._unregistering

    async def _unregister_all(self) -> None:
        for link in self._links:
            if link.task is not None:
                link.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await link.task
        identity = self.identity
        request = pb.UnregisterBrokerRequest(
            cluster_name=identity.cluster_name,
            broker_name=identity.broker_name,
            broker_id=identity.broker_id,
            storage_address=identity.storage_address,
        )
        try:
            await asyncio.gather(*(link.unregister(request) for link in self._links))
        finally:
            await asyncio.gather(*(link.close() for link in self._links))
