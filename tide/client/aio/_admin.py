"""``Admin`` of tide.client.aio: every call of the sync :class:`tide.client.Admin`, on a
grpc.aio channel.

The sync Admin's own code builds each request and converts each answer (one place for
both clients): it runs on a worker thread (``asyncio.to_thread``) over a bridge whose
``call`` awaits the grpc.aio call on the event loop. Admin calls are few and small, so
the thread hop costs nothing that matters; a cancelled Admin call runs to its end (its
answer is dropped)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from tide.auth.client import Credentials
from tide.client._admin import Admin as SyncAdmin
from tide.client._admin import Recalled
from tide.client._auth_admin import PolicyEntry, UserInfo
from tide.client._rpc import DEFAULT_GATEWAY, DEFAULT_RPC_TIMEOUT_MS, ClientTls, RetryPolicy
from tide.client._transactions import HalfMessage
from tide.client._types import PullResult, ReceivedMessage
from tide.client.aio._connection import AioConnection, Method
from tide.v1 import nameserver_pb2, storage_pb2

_T = TypeVar("_T")


class _Bridge:
    """The sync Admin's connection: ``call`` from its worker thread awaits the call on
    the loop (and raises the same TideError)."""

    def __init__(self, connection: AioConnection, loop: asyncio.AbstractEventLoop) -> None:
        self._connection = connection
        self._loop = loop
        self.stub = connection.stub

    def call(
        self,
        method: Method,
        request: Any,
        what: str,
        *,
        extra_timeout_ms: int = 0,
        retry: bool = True,
    ) -> Any:
        coroutine = self._connection.call(
            method, request, what, extra_timeout_ms=extra_timeout_ms, retry=retry
        )
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()


class Admin:
    """Topics, groups, the cluster, message queries, users and ACLs: the sync Admin's
    methods (same arguments, answers and errors) as coroutines."""

    def __init__(
        self,
        gateway: str = DEFAULT_GATEWAY,
        *,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        tls: ClientTls = False,
        credentials: Credentials | None = None,
    ) -> None:
        self._connection = AioConnection(
            gateway, rpc_timeout_ms=rpc_timeout_ms, retry=retry, tls=tls, credentials=credentials
        )
        self._admin: SyncAdmin | None = None

    async def _run(self, method: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        if self._admin is None:
            bridge = _Bridge(self._connection, asyncio.get_running_loop())
            self._admin = SyncAdmin.over(bridge)
        return await asyncio.to_thread(method, self._admin, *args, **kwargs)

    async def create_topic(self, *args: Any, **kwargs: Any) -> list[str]:
        """:meth:`tide.client.Admin.create_topic`."""
        return await self._run(SyncAdmin.create_topic, *args, **kwargs)

    async def delete_topic(self, *args: Any, **kwargs: Any) -> bool:
        """:meth:`tide.client.Admin.delete_topic`."""
        return await self._run(SyncAdmin.delete_topic, *args, **kwargs)

    async def list_topics(self, *args: Any, **kwargs: Any) -> list[str]:
        """:meth:`tide.client.Admin.list_topics`."""
        return await self._run(SyncAdmin.list_topics, *args, **kwargs)

    async def topic_types(self, *args: Any, **kwargs: Any) -> dict[str, str]:
        """:meth:`tide.client.Admin.topic_types`."""
        return await self._run(SyncAdmin.topic_types, *args, **kwargs)

    async def create_group(self, *args: Any, **kwargs: Any) -> list[str]:
        """:meth:`tide.client.Admin.create_group`."""
        return await self._run(SyncAdmin.create_group, *args, **kwargs)

    async def update_group(self, *args: Any, **kwargs: Any) -> list[str]:
        """:meth:`tide.client.Admin.update_group`."""
        return await self._run(SyncAdmin.update_group, *args, **kwargs)

    async def get_group(self, *args: Any, **kwargs: Any) -> storage_pb2.GetGroupResponse:
        """:meth:`tide.client.Admin.get_group`."""
        return await self._run(SyncAdmin.get_group, *args, **kwargs)

    async def queue_locks(self, *args: Any, **kwargs: Any) -> storage_pb2.GetQueueLocksResponse:
        """:meth:`tide.client.Admin.queue_locks`."""
        result: storage_pb2.GetQueueLocksResponse = await self._run(
            SyncAdmin.queue_locks, *args, **kwargs
        )
        return result

    async def list_groups(self, *args: Any, **kwargs: Any) -> list[storage_pb2.GroupConfig]:
        """:meth:`tide.client.Admin.list_groups`."""
        result: list[storage_pb2.GroupConfig] = await self._run(
            SyncAdmin.list_groups, *args, **kwargs
        )
        return result

    async def delete_group(self, *args: Any, **kwargs: Any) -> bool:
        """:meth:`tide.client.Admin.delete_group`."""
        return await self._run(SyncAdmin.delete_group, *args, **kwargs)

    async def route(self, *args: Any, **kwargs: Any) -> nameserver_pb2.TopicRoute:
        """:meth:`tide.client.Admin.route`."""
        return await self._run(SyncAdmin.route, *args, **kwargs)

    async def cluster(self, *args: Any, **kwargs: Any) -> nameserver_pb2.ClusterInfo:
        """:meth:`tide.client.Admin.cluster`."""
        return await self._run(SyncAdmin.cluster, *args, **kwargs)

    async def consumers(self, *args: Any, **kwargs: Any) -> list[str]:
        """:meth:`tide.client.Admin.consumers`."""
        return await self._run(SyncAdmin.consumers, *args, **kwargs)

    async def query_id(self, *args: Any, **kwargs: Any) -> ReceivedMessage:
        """:meth:`tide.client.Admin.query_id`."""
        return await self._run(SyncAdmin.query_id, *args, **kwargs)

    async def query_key(self, *args: Any, **kwargs: Any) -> list[ReceivedMessage]:
        """:meth:`tide.client.Admin.query_key`."""
        return await self._run(SyncAdmin.query_key, *args, **kwargs)

    async def query_unique_key(self, *args: Any, **kwargs: Any) -> list[ReceivedMessage]:
        """:meth:`tide.client.Admin.query_unique_key`."""
        return await self._run(SyncAdmin.query_unique_key, *args, **kwargs)

    async def recall(self, *args: Any, **kwargs: Any) -> Recalled:
        """:meth:`tide.client.Admin.recall`."""
        return await self._run(SyncAdmin.recall, *args, **kwargs)

    async def list_transactions(self, *args: Any, **kwargs: Any) -> list[HalfMessage]:
        """:meth:`tide.client.Admin.list_transactions`."""
        return await self._run(SyncAdmin.list_transactions, *args, **kwargs)

    async def browse_queue(self, *args: Any, **kwargs: Any) -> PullResult:
        """:meth:`tide.client.Admin.browse_queue`."""
        return await self._run(SyncAdmin.browse_queue, *args, **kwargs)

    async def create_user(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`tide.client.Admin.create_user`."""
        return await self._run(SyncAdmin.create_user, *args, **kwargs)

    async def update_user(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`tide.client.Admin.update_user`."""
        return await self._run(SyncAdmin.update_user, *args, **kwargs)

    async def delete_user(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`tide.client.Admin.delete_user`."""
        return await self._run(SyncAdmin.delete_user, *args, **kwargs)

    async def list_users(self, *args: Any, **kwargs: Any) -> list[UserInfo]:
        """:meth:`tide.client.Admin.list_users`."""
        return await self._run(SyncAdmin.list_users, *args, **kwargs)

    async def create_acl(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`tide.client.Admin.create_acl`."""
        return await self._run(SyncAdmin.create_acl, *args, **kwargs)

    async def update_acl(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`tide.client.Admin.update_acl`."""
        return await self._run(SyncAdmin.update_acl, *args, **kwargs)

    async def delete_acl(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`tide.client.Admin.delete_acl`."""
        return await self._run(SyncAdmin.delete_acl, *args, **kwargs)

    async def list_acls(self, *args: Any, **kwargs: Any) -> dict[str, list[PolicyEntry]]:
        """:meth:`tide.client.Admin.list_acls`."""
        return await self._run(SyncAdmin.list_acls, *args, **kwargs)

    async def close(self) -> None:
        """Idempotent."""
        await self._connection.close()

    async def __aenter__(self) -> Admin:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
