"""The followed storage's role, for every delivery service of the dispatch.

The delivery services deliver only while the storage they follow is a master
(GetStatus.replication.role is not SLAVE; decision 2 of issue 18): beside a slave they
hold, and the slave gets what its master delivers by replication. One watcher asks the
storage every ``--delivery-role-check-interval-ms`` and tells every service: ``active``
now, :meth:`RoleWatcher.wait_active` to wait for it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

import grpc

from tide.tasks import cancel_and_wait
from tide.v1 import storage_pb2 as pb

log = logging.getLogger("tide.dispatch.delivery")

ROLE_STATUS_TIMEOUT_S = 5.0
SLAVE_ROLE = "SLAVE"


class StatusSource(Protocol):
    target: str

    async def status(self, timeout_s: float = ...) -> pb.StorageStatus: ...


class RoleWatcher:
    """Whether the followed storage is a master: False before its first answer, and the
    last answer while it does not answer (a re-put waits for the storage anyway)."""

    def __init__(self, storage: StatusSource, interval_s: float) -> None:
        self._storage = storage
        self._interval_s = interval_s
        self._active = asyncio.Event()  # set while the storage is a master
        self._task: asyncio.Task[None] | None = None

    @property
    def active(self) -> bool:
        return self._active.is_set()

    async def wait_active(self) -> None:
        """Return once the storage is a master (at once when it is)."""
        await self._active.wait()

    async def refresh(self) -> bool:
        """Ask the storage now (not at the next interval) and return the answer; the last
        answer when it does not answer. For a caller that must not wait an interval after
        a master's start (EndTransaction, retried by its producer at once)."""
        try:
            status = await self._storage.status(ROLE_STATUS_TIMEOUT_S)
        except grpc.aio.AioRpcError:
            return self.active
        self._set(status.replication.role != SLAVE_ROLE)
        return self.active

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name="delivery-role")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _watch(self) -> None:
        while True:
            try:
                status = await self._storage.status(ROLE_STATUS_TIMEOUT_S)
            except grpc.aio.AioRpcError:
                pass  # unknown: keep the last answer
            else:
                self._set(status.replication.role != SLAVE_ROLE)
            await asyncio.sleep(self._interval_s)

    def _set(self, active: bool) -> None:
        if active == self.active:
            return
        if active:
            self._active.set()
        else:
            self._active.clear()
        log.info(
            "delivery services %s: storage %s is %s",
            "deliver" if active else "hold",
            self._storage.target,
            "a master" if active else "a slave",
        )
