"""The console's configuration: one frozen dataclass built from the command line."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tide.tls import TlsFiles

ENV_PREFIX = "TIDE_CONSOLE_"
DEFAULT_LISTEN = "127.0.0.1:8080"
DEFAULT_GATEWAY = "127.0.0.1:8081"
DEFAULT_RPC_TIMEOUT_MS = 10_000
# Login sessions expire this long after login (the cookie's Max-Age and Fernet's ttl).
DEFAULT_SESSION_MAX_AGE_S = 8 * 3600
MAX_SESSION_MAX_AGE_S = 7 * 24 * 3600
# Rows of a listing page (topics, groups, messages); a request may ask fewer.
DEFAULT_PAGE_SIZE_ROWS = 100
MAX_PAGE_SIZE_ROWS = 1000
MAX_METRICS_ENDPOINTS = 64
# Gateway clients kept open, one per logged-in user (least recently used closed first).
MAX_CACHED_CLIENTS = 64


class ConfigError(ValueError):
    """A bad option: the message names it."""


@dataclass(frozen=True)
class ConsoleConfig:
    """Everything the console is told; see docs/console.md, "Options"."""

    gateway: str = DEFAULT_GATEWAY
    listen: str = DEFAULT_LISTEN
    # Served over HTTPS with this certificate and key; the same files (and the CA) are the
    # console's TLS to the gateway, as every Tide service uses its certificate both ways.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None
    # TLS to the gateway with the system's roots (implied by tls_ca_file).
    gateway_tls: bool = False
    # 32 url-safe base64 bytes (a Fernet key); None: a random key per process.
    session_key_file: str | None = None
    session_max_age_s: int = DEFAULT_SESSION_MAX_AGE_S
    # name -> HOST:PORT of a service's Prometheus endpoint, for the live charts.
    metrics_endpoints: tuple[tuple[str, str], ...] = ()
    page_size_rows: int = DEFAULT_PAGE_SIZE_ROWS
    max_page_size_rows: int = MAX_PAGE_SIZE_ROWS
    rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS
    log_level: str = "info"
    # A message's OpenTelemetry trace page, "{trace_id}" replaced (e.g. Jaeger's); "": none.
    trace_url_template: str = ""

    @property
    def https(self) -> bool:
        return self.tls_cert_file is not None

    def gateway_tls_files(self) -> TlsFiles | bool:
        """The ``tls=`` of tide.client for the gateway."""
        files = TlsFiles(self.tls_cert_file, self.tls_key_file, self.tls_ca_file)
        if self.tls_ca_file is not None:
            return files
        return self.gateway_tls

    def listen_host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)


def _host_port(text: str, what: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} {text[:80]!r} is not HOST:PORT (port 0..65535)")
    return text


def _metrics(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    if len(values) > MAX_METRICS_ENDPOINTS:
        raise ConfigError(
            f"--metrics-endpoint given {len(values)} times; at most {MAX_METRICS_ENDPOINTS}"
        )
    pairs = []
    for value in values:
        name, sep, endpoint = value.partition("=")
        if not sep or not name:
            raise ConfigError(f"--metrics-endpoint {value[:80]!r} is not NAME=HOST:PORT")
        pairs.append((name, _host_port(endpoint, "--metrics-endpoint")))
    return tuple(pairs)


def parser() -> argparse.ArgumentParser:
    cli = argparse.ArgumentParser(
        prog="tide console",
        description="The Tide web console (docs/console.md). Every option can also be set "
        "as TIDE_CONSOLE_<OPTION> in the environment (TIDE_CONSOLE_GATEWAY=...); flags "
        "outrank it.",
    )
    cli.add_argument("--listen", default=DEFAULT_LISTEN, help="HOST:PORT to serve (0: any port)")
    cli.add_argument("--gateway", default=DEFAULT_GATEWAY, help="the gateway, HOST:PORT")
    cli.add_argument(
        "--tls-cert-file",
        help="PEM certificate: serve HTTPS (and the client certificate to the gateway)",
    )
    cli.add_argument("--tls-key-file", help="PEM private key of --tls-cert-file")
    cli.add_argument("--tls-ca-file", help="PEM CA bundle that verifies the gateway (TLS to it)")
    cli.add_argument(
        "--gateway-tls", action="store_true", help="TLS to the gateway with the system's roots"
    )
    cli.add_argument(
        "--session-key-file",
        help="a Fernet key (32 url-safe base64 bytes) that "
        "encrypts the session cookies; default: random per process (a restart "
        "logs everyone out; replicas behind one Service need the same key)",
    )
    cli.add_argument(
        "--session-max-age-s",
        type=int,
        default=DEFAULT_SESSION_MAX_AGE_S,
        help=f"login lifetime [unit: s] (1..{MAX_SESSION_MAX_AGE_S})",
    )
    cli.add_argument(
        "--metrics-endpoint",
        action="append",
        default=[],
        metavar="NAME=HOST:PORT",
        help="a service's Prometheus endpoint (repeatable): the live charts; a storage's, "
        "named after its broker member (broker-a, broker-a-1 for slave 1), also gives the "
        "cluster page its disk, writable and replication figures",
    )
    cli.add_argument(
        "--page-size-rows",
        type=int,
        default=DEFAULT_PAGE_SIZE_ROWS,
        help=f"rows per listing page (1..{MAX_PAGE_SIZE_ROWS})",
    )
    cli.add_argument(
        "--rpc-timeout-ms",
        type=int,
        default=DEFAULT_RPC_TIMEOUT_MS,
        help="each gateway call's timeout [unit: ms]",
    )
    cli.add_argument(
        "--trace-url-template",
        default="",
        metavar="URL",
        help="a trace's page, {trace_id} replaced: the messages page links a message "
        "carrying a traceparent to it (e.g. http://jaeger:16686/trace/{trace_id})",
    )
    cli.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return cli


def _env_defaults(cli: argparse.ArgumentParser, env: Mapping[str, str]) -> None:
    """TIDE_CONSOLE_<OPTION> (e.g. TIDE_CONSOLE_GATEWAY) as each option's default, as the
    other services read TIDE_<SERVICE>_<OPTION>; flags outrank it. A repeatable option
    takes a comma-separated list."""
    for action in cli._actions:
        value = env.get(ENV_PREFIX + action.dest.upper())
        if value is None or action.dest == "help":
            continue
        if isinstance(action, argparse._StoreTrueAction):
            action.default = value.strip().lower() in ("1", "true", "yes", "on")
        elif isinstance(action, argparse._AppendAction):
            action.default = [item for item in value.split(",") if item]
        else:
            action.default = value


def from_args(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ConsoleConfig:
    """Parse ``argv`` (over the TIDE_CONSOLE_* environment); a bad value is a
    :class:`ConfigError` naming the option."""
    cli = parser()
    _env_defaults(cli, os.environ if env is None else env)
    args = cli.parse_args(argv)
    if (args.tls_cert_file is None) != (args.tls_key_file is None):
        raise ConfigError("--tls-cert-file and --tls-key-file go together")
    if not 1 <= args.session_max_age_s <= MAX_SESSION_MAX_AGE_S:
        raise ConfigError(
            f"--session-max-age-s is {args.session_max_age_s}; give 1..{MAX_SESSION_MAX_AGE_S}"
        )
    if not 1 <= args.page_size_rows <= MAX_PAGE_SIZE_ROWS:
        raise ConfigError(
            f"--page-size-rows is {args.page_size_rows}; give 1..{MAX_PAGE_SIZE_ROWS}"
        )
    if args.rpc_timeout_ms <= 0:
        raise ConfigError(f"--rpc-timeout-ms is {args.rpc_timeout_ms}; give a positive value")
    if args.trace_url_template and "{trace_id}" not in args.trace_url_template:
        raise ConfigError(
            f"--trace-url-template {args.trace_url_template[:80]!r} has no {{trace_id}}: give "
            "e.g. http://jaeger:16686/trace/{trace_id}"
        )
    return ConsoleConfig(
        gateway=_host_port(args.gateway, "--gateway"),
        listen=_host_port(args.listen, "--listen"),
        tls_cert_file=args.tls_cert_file,
        tls_key_file=args.tls_key_file,
        tls_ca_file=args.tls_ca_file,
        gateway_tls=args.gateway_tls,
        session_key_file=args.session_key_file,
        session_max_age_s=args.session_max_age_s,
        metrics_endpoints=_metrics(args.metrics_endpoint),
        page_size_rows=args.page_size_rows,
        rpc_timeout_ms=args.rpc_timeout_ms,
        log_level=args.log_level,
        trace_url_template=args.trace_url_template,
    )
