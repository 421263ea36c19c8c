"""The gateway's copy of the users and ACLs: fetched from a master storage every
``--auth-refresh-interval-ms`` (bounded: one GetAuth per interval), so a change made with
``tide user`` / ``tide acl`` is effective within an interval, without restarts. While no
storage answers, the last copy stays in use (and none at start: every call is refused)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from services.gateway.auth.authority import Authority, AuthState
from tide.auth.model import PolicyEntry, User
from tide.auth.wire import entries_from_pb, user_from_pb
from tide.v1 import storage_pb2 as storage_pb

log = logging.getLogger("tide.gateway.auth")
Fetch = Callable[[], Awaitable[storage_pb.GetAuthResponse]]


def state_of(answer: storage_pb.GetAuthResponse) -> AuthState:
    users: dict[str, User] = {}
    for pb_user in answer.users:
        try:
            users[pb_user.access_key] = user_from_pb(pb_user)
        except ValueError as exc:  # a storage wrote it, so it was checked; skip if not
            log.warning("skipping a user the storage holds: %s", exc)
    policies: dict[str, tuple[PolicyEntry, ...]] = {}
    for acl in answer.acls:
        try:
            policies[acl.access_key] = entries_from_pb(acl)
        except ValueError as exc:
            log.warning("skipping the ACL of %r: %s", acl.access_key, exc)
    return AuthState(users, policies)


class AuthCache:
    def __init__(
        self,
        authority: Authority,
        fetch: Fetch,
        interval_s: float,
        tick: Callable[[], None] = lambda: None,
    ) -> None:
        self._authority = authority
        self._tick = tick  # the audit's sweep: suppressed denials reported after a flood
        self._fetch = fetch
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def refresh(self) -> None:
        self._authority.state = state_of(await self._fetch())

    async def _run(self) -> None:
        failing = False
        while True:
            try:
                await self.refresh()
                failing = False
            except Exception as exc:  # keep the last copy; say so once per outage
                if not failing:
                    log.warning("cannot fetch users and ACLs (keeping the last copy): %s", exc)
                failing = True
            self._tick()
            await asyncio.sleep(self._interval_s)
