"""The shared asyncio gRPC server runner: health, reflection, signals, graceful stop.

Lifecycle of :func:`serve`:

1. bind ``listen`` and start the server; health is NOT_SERVING and the service's own
   methods answer UNAVAILABLE;
2. ``await service.start(endpoint)``; then health turns SERVING for ``""`` and ``service.name``,
   ``listening on HOST:PORT`` is logged and ``ready_callback(HOST:PORT)`` is called;
3. on SIGTERM/SIGINT (or ``stop_event``): health NOT_SERVING, ``server.stop(grace)`` (no new
   calls, in-flight calls get up to the grace period), then ``await service.stop()``.
   A second signal during shutdown exits at once with status 128 + signal number.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import socket
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tide.server._cluster_secret import (
    SECRET,
    ClusterSecretError,
    ClusterSecretInterceptor,
    load_cluster_secret,
)
from tide.server._config import Config
from tide.server._event_loop import run_on, running_loop_name
from tide.server._gc import tune_gc_for_serving
from tide.server._generic_handlers import GenericHandlers
from tide.server._health import NOT_SERVING, SERVING, HealthServicer
from tide.server._interceptor import ErrorInterceptor, Readiness
from tide.server._logging import configure_logging
from tide.server._malloc import tune_malloc
from tide.server._metrics import RpcMetrics, short_service_name
from tide.server._telemetry import Telemetry, TelemetryError, configure_telemetry
from tide.spawn import READY_FILE_ENV
from tide.tls import (
    MAX_RELOAD_INTERVAL_MS,
    MIN_RELOAD_INTERVAL_MS,
    TlsError,
    TlsFiles,
    server_credentials,
    set_internal_tls,
)

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# An answer may carry MAX_MESSAGE_BYTES of records (a storage Read) plus the fields
# around them; every receiver (the services' channels, tide.client) takes this much more.
ANSWER_FRAMING_BYTES = 1024 * 1024
MAX_PENDING_REQUESTS = 20_000
# (The receive limit is serve's max_receive_bytes: MAX_MESSAGE_BYTES unless a service
# takes larger requests.)
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES + ANSWER_FRAMING_BYTES),
    # Without this, a second server on the same port binds "successfully" (SO_REUSEPORT).
    ("grpc.so_reuseport", 0),
    # Calls not yet taken in by the server (held long polls do not count). gRPC's default
    # (1,000 soft, 3,000 hard) cancels a burst of long polls arriving together.
    ("grpc.server.max_pending_requests", MAX_PENDING_REQUESTS),
    ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_REQUESTS),
)
HEALTH_SERVICE_NAME: str = health.SERVICE_NAME
REFLECTION_SERVICE_NAME: str = reflection.SERVICE_NAME

_log = logging.getLogger("tide.server")
ReadyCallback = Callable[[str], object]


class Service(Protocol):
    """What a Tide service gives the runner."""

    @property
    def name(self) -> str:
        """Full gRPC service name, e.g. ``tide.v1.Storage``."""
        ...

    def add_to_server(self, server: grpc.aio.Server) -> None:
        """Register the servicer(s), e.g. ``add_StorageServicer_to_server(self, server)``."""
        ...

    async def start(self, endpoint: str) -> None:
        """Open stores, start background work; ``endpoint`` is the bound ``HOST:PORT``
        (the real port when listening on port 0). Runs before health turns SERVING; if it
        raises, it must release what it opened (``stop`` is not called)."""
        ...

    def drain(self) -> None:
        """Shutdown has begun: end open-ended streams (tails, watches) soon, cleanly.
        Unary calls in flight still finish; ``stop`` follows."""
        ...

    async def stop(self) -> None:
        """Flush and close; runs after in-flight calls finished or the grace period ran out."""
        ...


class ListenError(RuntimeError):
    """A ``--listen`` value that is malformed or cannot be bound."""


@dataclass(frozen=True, slots=True)
class ServerTls:
    """TLS for :func:`serve`: the files and how often they are checked for a new certificate."""

    files: TlsFiles
    reload_interval_ms: int


def requires_client_cert(service: Service) -> bool:
    """Whether the service's port takes only clients with a certificate the cluster CA signed.

    Every Tide service is internal (only other Tide services call it) except one that says
    ``public_port = True`` (the gateway: its clients authenticate by signature, not by
    certificate)."""
    return not bool(getattr(service, "public_port", False))


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port)."""
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise ListenError(f"--listen: expected HOST:PORT, got {listen!r}")
    return host, int(port_text)


async def serve(
    service: Service,
    listen: str,
    *,
    shutdown_grace_s: float,
    ready_callback: ReadyCallback | None = None,
    stop_event: asyncio.Event | None = None,
    handle_signals: bool = True,
    max_receive_bytes: int = MAX_MESSAGE_BYTES,
    tls: ServerTls | None = None,
) -> None:
    """Run ``service`` until SIGTERM/SIGINT (``handle_signals``) or ``stop_event`` is set.
    A request over ``max_receive_bytes`` is refused by gRPC (RESOURCE_EXHAUSTED).

    Raises :class:`ListenError` if ``listen`` is malformed or cannot be bound.
    """
    host, port = parse_listen(listen)
    readiness = Readiness(service.name, served_names(service)[1:])
    rpc_metrics = RpcMetrics(short_service_name(service.name))
    options = [*SERVER_OPTIONS, ("grpc.max_receive_message_length", max_receive_bytes)]
    # A service's own interceptors (the gateway's authentication) run inside the error
    # interceptor, so their refusals are counted and reported like any error.
    interceptors = [ErrorInterceptor(readiness, rpc_metrics), *service_interceptors(service)]
    if SECRET.value is not None and not getattr(service, "public", False):
        interceptors.insert(0, ClusterSecretInterceptor())  # before anything else runs
    server = grpc.aio.server(interceptors=interceptors, options=options)
    health_servicer = await _add_services(server, service)
    endpoint = _bind(server, host, port, _credentials(service, tls))
    stop = stop_event if stop_event is not None else asyncio.Event()
    with _signal_handlers(stop, handle_signals):
        await server.start()
        try:
            started = await _start_unless_stopped(service, endpoint, stop)
        except BaseException:
            await server.stop(None)
            raise
        if not started:  # a signal came while starting: start() was cancelled
            _log.info("stopped while starting %s", service.name)
            await server.stop(None)
            return
        try:
            if not stop.is_set():
                await _mark_serving(health_servicer, readiness, endpoint, ready_callback)
            await stop.wait()
        finally:
            await _shutdown(server, service, health_servicer, readiness, shutdown_grace_s)


def service_interceptors(service: Service) -> list[grpc.aio.ServerInterceptor]:  # type: ignore[type-arg]
    """The interceptors a service asks for (an optional ``interceptors`` attribute)."""
    return list(getattr(service, "interceptors", ()))


async def _start_unless_stopped(service: Service, endpoint: str, stop: asyncio.Event) -> bool:
    """``service.start`` unless ``stop`` is set first (e.g. SIGTERM while the service still
    waits for a dependency); then the start is cancelled (it must release what it opened,
    as for any failed start) and False is returned."""
    starting = asyncio.ensure_future(service.start(endpoint))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if starting.done():
        starting.result()  # re-raise a failed start
        return True
    starting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await starting
    return False


def run_service(
    service: Service, config: Config, *, max_receive_bytes: int = MAX_MESSAGE_BYTES
) -> None:
    """Configure logging and telemetry from ``config``, then :func:`serve` until a signal.

    Returns after a clean shutdown (exit status 0); exits with status 1 (2 for a malformed
    ``--listen`` or telemetry option) after logging the cause otherwise.
    """
    configure_logging(config.get_str("log_level"), config.get_str("log_format"), config.service)
    tune_malloc()
    listen = config.get_str("listen")
    try:
        parse_listen(listen)
        tls = tls_from_config(config)
        if tls is None:
            set_internal_tls(None)
        else:
            set_internal_tls(tls.files, reload_interval_ms=tls.reload_interval_ms)
        load_cluster_secret(config.get_optional_str("cluster_secret_file"))
        telemetry = telemetry_from_config(config)
    except (ListenError, TelemetryError, TlsError, ClusterSecretError) as exc:
        _log.error("%s", exc)
        raise SystemExit(2) from exc
    if telemetry.metrics_endpoint:
        _log.info("metrics on http://%s/metrics", telemetry.metrics_endpoint)
    try:
        run_on(
            config.get_str("event_loop"),
            serve(
                service,
                listen,
                shutdown_grace_s=config.get_float("shutdown_grace_s"),
                max_receive_bytes=max_receive_bytes,
                tls=tls,
                ready_callback=lambda endpoint: _write_ready_file(
                    config, service, endpoint, telemetry.metrics_endpoint
                ),
            ),
        )
    except ListenError as exc:
        _log.error("%s", exc)
        raise SystemExit(1) from exc
    except Exception as exc:
        _log.exception("%s failed", service.name)
        raise SystemExit(1) from exc
    finally:
        telemetry.shutdown()
    _log.info("stopped")


def tls_from_config(config: Config) -> ServerTls | None:
    """The ``--tls-*`` options (None: plaintext). Raises :class:`TlsError` naming the option
    when they do not fit together or a file cannot be read."""
    files = TlsFiles(
        cert_file=config.get_optional_str("tls_cert_file"),
        key_file=config.get_optional_str("tls_key_file"),
        ca_file=config.get_optional_str("tls_ca_file"),
    )
    if files == TlsFiles():
        return None
    problem = config.int_out_of_range(
        {"tls_reload_interval_ms": (MIN_RELOAD_INTERVAL_MS, MAX_RELOAD_INTERVAL_MS)}
    )
    if problem:
        raise TlsError(problem)
    if not files.has_identity:
        raise TlsError("TLS needs --tls-cert-file and --tls-key-file (and --tls-ca-file)")
    if files.ca_file is None:
        raise TlsError("TLS needs --tls-ca-file: the CA that signs the cluster's certificates")
    files.check()
    return ServerTls(files, config.get_int("tls_reload_interval_ms"))


def telemetry_from_config(config: Config) -> Telemetry:
    """:func:`configure_telemetry` from the common options (installed globally)."""
    return configure_telemetry(
        config.get_optional_str("otel_service_name") or f"tide-{config.service}",
        config.get_str("otel_traces_exporter"),
        config.get_str("otel_metrics_exporter"),
        sampler_ratio=config.get_float("otel_traces_sampler_ratio"),
        traces_file=config.get_optional_str("otel_traces_file"),
        metrics_listen=config.get_optional_str("metrics_listen"),
    )


def write_ready_file(path: str, info: Mapping[str, object]) -> None:
    """Write ``info`` as JSON to ``path`` atomically (temporary file + rename)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(info, out)
        out.write("\n")
    os.replace(tmp, path)


def served_names(service: Service) -> tuple[str, ...]:
    """The gRPC services a Service serves: its ``name`` and, when it serves more on the
    same port, its optional ``more_service_names`` (the gateway's RocketMQ 5 API)."""
    more: tuple[str, ...] = tuple(getattr(service, "more_service_names", ()))
    return (service.name, *more)


async def _add_services(server: grpc.aio.Server, service: Service) -> HealthServicer:
    # Generic handlers only: methods registered by name cost every call (_generic_handlers).
    handlers = GenericHandlers()
    service.add_to_server(handlers)
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, handlers)
    names = (*served_names(service), HEALTH_SERVICE_NAME, REFLECTION_SERVICE_NAME)
    reflection.enable_server_reflection(names, handlers)
    server.add_generic_rpc_handlers(handlers.handlers)
    for name in ("", *served_names(service)):
        await health_servicer.set(name, NOT_SERVING)
    return health_servicer


def _credentials(service: Service, tls: ServerTls | None) -> grpc.ServerCredentials | None:
    if tls is None:
        return None
    return server_credentials(
        tls.files,
        require_client_cert=requires_client_cert(service),
        reload_interval_ms=tls.reload_interval_ms,
    )


def _bind(
    server: grpc.aio.Server,
    host: str,
    port: int,
    credentials: grpc.ServerCredentials | None = None,
) -> str:
    """Bind ``host:port`` (TLS with ``credentials``); returns ``host:actual_port``."""
    address = f"{host}:{port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        raise ListenError(f"cannot listen on {address}: {_bind_problem(host, port)}") from exc
    if bound == 0:
        raise ListenError(f"cannot listen on {address}: {_bind_problem(host, port)}")
    return f"{host}:{bound}"


def _bind_problem(host: str, port: int) -> str:
    """Why binding failed, found by binding a plain socket the same way."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"cannot resolve {host}: {exc.strerror}"
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "address in use"
            return (exc.strerror or str(exc)).lower()
    return "bind failed (see the gRPC error above)"


async def _mark_serving(
    health_servicer: HealthServicer,
    readiness: Readiness,
    endpoint: str,
    ready_callback: ReadyCallback | None,
) -> None:
    readiness.state = "serving"
    tune_gc_for_serving()
    for name in ("", *readiness.names):
        await health_servicer.set(name, SERVING)
    _log.info(
        "listening on %s (event loop: %s)",
        endpoint,
        running_loop_name(),
        extra={"grpc_service": readiness.service_name},
    )
    if ready_callback is not None:
        ready_callback(endpoint)


async def _shutdown(
    server: grpc.aio.Server,
    service: Service,
    health_servicer: HealthServicer,
    readiness: Readiness,
    grace_s: float,
) -> None:
    readiness.state = "stopping"
    await health_servicer.enter_graceful_shutdown()
    service.drain()  # end open-ended streams so they do not hold the grace period
    _log.info("stopping: in-flight calls have %ss to finish", grace_s)
    await server.stop(grace_s)
    _log.info("server stopped; stopping %s", service.name)
    await service.stop()


@contextlib.contextmanager
def _signal_handlers(stop: asyncio.Event, enabled: bool) -> Iterator[None]:
    """SIGTERM/SIGINT set ``stop``; a second one while stopping exits at once."""
    if not enabled:
        yield
        return
    loop = asyncio.get_running_loop()

    def on_signal(signum: signal.Signals) -> None:
        if stop.is_set():
            _log.error("%s during shutdown: exiting immediately", signum.name)
            logging.shutdown()
            os._exit(128 + signum.value)
        _log.info("%s: shutting down", signum.name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)


def _write_ready_file(
    config: Config, service: Service, endpoint: str, metrics_endpoint: str | None = None
) -> None:
    path = os.environ.get(READY_FILE_ENV)
    if not path:
        return
    info: dict[str, object] = {
        "service": config.service,
        "grpc_service": service.name,
        "listen": endpoint,
        "event_loop": running_loop_name(),
    }
    if metrics_endpoint:
        info["metrics"] = metrics_endpoint
    write_ready_file(path, {**info, "pid": os.getpid()})
    _log.info("wrote ready file %s", path)
