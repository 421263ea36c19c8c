"""Internal links whose client certificate follows its files (rotation; docs/security.md).

A gRPC channel's credentials are fixed when it is made, and a service keeps its channels
to other services for its whole life (the gateway's per-broker channels, the dispatch's
storage client, registration). So :func:`tide.tls.internal_channel` hands out a
:class:`ReloadingChannel`: a channel that opens a fresh underlying channel, with the
credentials read again, once :class:`ClientFiles` sees the certificate, key or CA file
change (checked at most once per reload interval, on a call: a clock compare otherwise).
Calls started after the change go over new connections presenting the new certificate;
calls already running (long streams: replication, tails, append streams) finish on the
retired channel, which is kept open (connections open keep their certificate, as on the
servers) and closed with the proxy, or when more than ``MAX_RETIRED_CHANNELS`` pile up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from tide._forwarding_channel import ForwardingChannel

_log = logging.getLogger("tide.tls")

# Retired channels a proxy keeps open for the calls still running on them; beyond this
# the oldest is closed with a grace (a rotation is rare: this bounds a flapping file).
MAX_RETIRED_CHANNELS = 4
RETIRED_CLOSE_GRACE_S = 30.0


class ClientFiles:
    """The client side's certificate files and the credentials built from them: a new
    generation when a file's (mtime, size) changed and the files load."""

    def __init__(
        self,
        paths: list[str],
        build: Callable[[], grpc.ChannelCredentials],
        *,
        reload_interval_ms: int,
    ) -> None:
        self._paths = paths
        self._build = build
        self._interval_s = reload_interval_ms / 1000
        self._lock = threading.Lock()
        self._next_check = time.monotonic() + self._interval_s
        self._stamp = self._stamps()
        self._credentials = build()
        self.generation = 0

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        stamps = []
        for path in self._paths:
            try:
                stat = os.stat(path)
            except OSError:
                stamps.append((-1, -1))  # mid-replacement: try again at the next check
            else:
                stamps.append((stat.st_mtime_ns, stat.st_size))
        return tuple(stamps)

    def current(self) -> tuple[int, grpc.ChannelCredentials]:
        """(generation, credentials), the files checked when the interval has passed."""
        now = time.monotonic()
        if now >= self._next_check:
            with self._lock:
                if now >= self._next_check:
                    self._next_check = now + self._interval_s
                    self._check()
        return self.generation, self._credentials

    def _check(self) -> None:
        stamp = self._stamps()
        if stamp == self._stamp or (-1, -1) in stamp:
            return
        try:
            credentials = self._build()
        except ValueError as exc:  # TlsError: keep the links' current certificate
            _log.warning("client certificate reload failed, keeping the current one: %s", exc)
            return
        self._stamp, self._credentials = stamp, credentials
        self.generation += 1
        _log.info("reloaded the client TLS certificate of the internal links (%s)", self._paths)


class _Lazy:
    """A multicallable that resolves the proxy's current channel at each call."""

    def __init__(self, proxy: ReloadingChannel, kind: str, args: tuple[Any, ...], kw: Any) -> None:
        self._proxy, self._kind, self._args, self._kw = proxy, kind, args, kw
        self._bound: tuple[grpc.aio.Channel | None, Any] = (None, None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        channel = self._proxy.current()
        bound_to, multicallable = self._bound
        if bound_to is not channel:
            multicallable = getattr(channel, self._kind)(*self._args, **self._kw)
            self._bound = (channel, multicallable)
        return multicallable(*args, **kwargs)


class ReloadingChannel(ForwardingChannel):
    """An aio channel that reopens its underlying channel when ``files`` changes."""

    def __init__(
        self, files: ClientFiles, open_channel: Callable[[grpc.ChannelCredentials], Any]
    ) -> None:
        self._files = files
        self._open = open_channel
        self._generation, credentials = files.current()
        self._channel: grpc.aio.Channel = open_channel(credentials)
        self._retired: list[grpc.aio.Channel] = []
        self._closing: set[asyncio.Task[None]] = set()

    def current(self) -> grpc.aio.Channel:
        generation, credentials = self._files.current()
        if generation != self._generation:
            self._retired.append(self._channel)
            self._channel = self._open(credentials)
            self._generation = generation
            if len(self._retired) > MAX_RETIRED_CHANNELS:
                task = asyncio.ensure_future(self._retired.pop(0).close(RETIRED_CLOSE_GRACE_S))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
        return self._channel

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _Lazy(self, "unary_unary", args, kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _Lazy(self, "unary_stream", args, kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _Lazy(self, "stream_unary", args, kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _Lazy(self, "stream_stream", args, kwargs)

    async def close(self, grace: float | None = None) -> None:
        channels = [*self._retired, self._channel]
        self._retired = []
        await asyncio.gather(*(channel.close(grace) for channel in channels))
