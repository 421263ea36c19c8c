"""One gRPC channel to a gateway, with bounded retries on UNAVAILABLE."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from tide.auth.client import Credentials, signed_channel
from tide.client._errors import InvalidArgument, Unavailable, error_from_rpc
from tide.tls import TlsError, TlsFiles, channel_credentials
from tide.v1 import gateway_pb2_grpc

_log = logging.getLogger("tide.client")

DEFAULT_GATEWAY = "127.0.0.1:8081"
DEFAULT_RPC_TIMEOUT_MS = 10_000
MAX_RETRY_ATTEMPTS = 10
# The gateway (every Tide server) sends and receives messages of at most 64 MiB
# (tide.server.MAX_MESSAGE_BYTES; not imported: the client stays free of the server's
# dependencies). A pull is cut below that by the gateway; the client receives a little
# more for framing, and sends no more than the gateway takes (a larger request fails
# here, before it crosses the network).
GATEWAY_MAX_MESSAGE_BYTES = 64 << 20
MAX_RECEIVE_BYTES = GATEWAY_MAX_MESSAGE_BYTES + (1 << 20)
MAX_SEND_BYTES = GATEWAY_MAX_MESSAGE_BYTES
# gRPC reconnects a channel whose gateway went away with a backoff growing to 120 s by
# default: calls made meanwhile fail at once (UNAVAILABLE) even after the gateway is back,
# so a client learnt of a gateway's return up to about half the outage's length late
# (measured: 11 s after a 30 s outage). Capped, it reconnects within a few seconds.
INITIAL_RECONNECT_BACKOFF_MS = 500
MAX_RECONNECT_BACKOFF_MS = 2_000

# ``tls=`` of every client: False (plaintext), True (TLS, the server verified with the
# system's CA roots) or TlsFiles (ca_file verifies the gateway; cert_file and key_file,
# when given, are a client certificate).
ClientTls = bool | TlsFiles
CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    ("grpc.max_send_message_length", MAX_SEND_BYTES),
    ("grpc.initial_reconnect_backoff_ms", INITIAL_RECONNECT_BACKOFF_MS),
    ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
)

Req = TypeVar("Req")
Resp = TypeVar("Resp")


@dataclass(frozen=True)
class RetryPolicy:
    """How often a call is tried when the gateway is UNAVAILABLE, and the waits between.

    Only UNAVAILABLE is retried (the gateway or every broker unreachable). A produce retried
    after a connection broke mid-call can store the message twice (at-least-once).
    """

    max_attempts: int = 3
    initial_backoff_ms: int = 100
    max_backoff_ms: int = 2_000
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= MAX_RETRY_ATTEMPTS:
            raise InvalidArgument(
                f"max_attempts is {self.max_attempts}; give 1 to {MAX_RETRY_ATTEMPTS}"
            )
        if self.initial_backoff_ms < 0 or self.max_backoff_ms < self.initial_backoff_ms:
            raise InvalidArgument(
                "backoff must satisfy 0 <= initial_backoff_ms <= max_backoff_ms, got "
                f"{self.initial_backoff_ms} and {self.max_backoff_ms}"
            )
        if self.multiplier < 1:
            raise InvalidArgument(f"multiplier is {self.multiplier}; give 1 or more")

    def backoff_ms(self, failures: int) -> int:
        """The wait after the ``failures``-th failed attempt (1-based)."""
        wait = self.initial_backoff_ms * self.multiplier ** max(0, failures - 1)
        return int(min(wait, self.max_backoff_ms))


class Connection:
    """A channel and Gateway stub; ``call`` adds the timeout, retries and error mapping."""

    def __init__(
        self,
        gateway: str,
        *,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        tls: ClientTls = False,
        credentials: Credentials | None = None,
    ) -> None:
        """``credentials``: sign every call (a gateway with --auth-enabled); by default
        TIDE_ACCESS_KEY / TIDE_SECRET_KEY when both are set."""
        check_connection(gateway, rpc_timeout_ms)
        self.gateway = gateway
        self.rpc_timeout_ms = rpc_timeout_ms
        self.retry = retry or RetryPolicy()
        self._closed = threading.Event()
        self._local = threading.local()
        self._raw_channel = open_channel(gateway, tls)
        self._channel = signed_channel(
            self._raw_channel, credentials if credentials is not None else Credentials.from_env()
        )
        self.stub = gateway_pb2_grpc.GatewayStub(self._channel)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @contextlib.contextmanager
    def single_attempt(self) -> Iterator[None]:
        """Within the block, calls made by this thread are tried once (no retry)."""
        previous = getattr(self._local, "single", False)
        self._local.single = True
        try:
            yield
        finally:
            self._local.single = previous

    def call(
        self,
        method: grpc.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        what: str,
        *,
        extra_timeout_ms: int = 0,
        retry: bool = True,
    ) -> Resp:
        """Call ``method``; raise a TideError naming ``what`` when it fails.

        Each attempt has ``rpc_timeout_ms + extra_timeout_ms`` (a long poll adds its wait).
        """
        single = getattr(self._local, "single", False)
        attempts = self.retry.max_attempts if retry and not single else 1
        timeout_s = (self.rpc_timeout_ms + extra_timeout_ms) / 1000
        failures = 0
        while True:
            if self._closed.is_set():
                raise Unavailable(f"{what}: the client is closed")
            try:
                return method(request, timeout=timeout_s)
            except grpc.RpcError as exc:
                error = error_from_rpc(exc, what)
                failures += 1
                if not isinstance(error, Unavailable) or failures >= attempts:
                    raise error from exc
                wait_ms = self.retry.backoff_ms(failures)
                _log.warning(
                    "%s (attempt %d of %d); retrying in %d ms", error, failures, attempts, wait_ms
                )
                if self._closed.wait(wait_ms / 1000):
                    raise Unavailable(f"{what}: the client closed while retrying") from exc

    def future(
        self,
        method: grpc.UnaryUnaryMultiCallable[Req, Resp],
        request: Req,
        *,
        extra_timeout_ms: int = 0,
    ) -> grpc.Future[Resp]:
        """Start one attempt without waiting (for a long poll that may be cancelled)."""
        future: Any = method.future(
            request, timeout=(self.rpc_timeout_ms + extra_timeout_ms) / 1000
        )
        return future  # type: ignore[no-any-return]

    def close(self) -> None:
        self._closed.set()
        self._channel.close()


def check_connection(gateway: str, rpc_timeout_ms: int) -> None:
    """Both clients' connection options, checked."""
    if not gateway or ":" not in gateway:
        raise InvalidArgument(f"gateway {gateway!r} is not HOST:PORT")
    if rpc_timeout_ms <= 0:
        raise InvalidArgument(f"rpc_timeout_ms is {rpc_timeout_ms}; give a positive value")


def tls_credentials(tls: ClientTls) -> grpc.ChannelCredentials | None:
    """The channel credentials of ``tls=`` (None: plaintext); a file that cannot be read
    is InvalidArgument naming it."""
    if tls is False:
        return None
    files = TlsFiles() if tls is True else tls
    try:
        return channel_credentials(files, prefix="TlsFiles.")
    except TlsError as exc:
        raise InvalidArgument(f"tls: {exc}") from exc


def open_channel(gateway: str, tls: ClientTls = False) -> grpc.Channel:
    """The one channel builder of tide.client (and the CLI): plaintext, or TLS as ``tls``
    says (:data:`ClientTls`). ``tide bench`` opens its asyncio channels with the same
    :func:`tls_credentials`."""
    credentials = tls_credentials(tls)
    if credentials is None:
        return grpc.insecure_channel(gateway, options=list(CHANNEL_OPTIONS))
    return grpc.secure_channel(gateway, credentials, options=list(CHANNEL_OPTIONS))
