"""``python -m services.console``: serve the console with uvicorn; writes the ready file
(TIDE_READY_FILE: ``{"listen", "url", "pid"}``) once it serves, as the other services do."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from types import FrameType

from tide.grpc_defaults import use_tide_grpc_defaults

use_tide_grpc_defaults()  # before anything imports grpc (tide/grpc_defaults.py)

import uvicorn  # noqa: E402

from services.console.app import create_app  # noqa: E402
from services.console.config import ConfigError, ConsoleConfig, from_args  # noqa: E402
from tide.server import READY_FILE_ENV, write_ready_file  # noqa: E402

_log = logging.getLogger("services.console")


def _bind(config: ConsoleConfig) -> socket.socket:
    host, port = config.listen_host_port()
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def main(argv: list[str]) -> int:
    try:
        config = from_args(argv)
    except ConfigError as exc:
        print(f"tide console: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        sock = _bind(config)
    except OSError as exc:
        print(f"tide console: cannot listen on {config.listen}: {exc.strerror}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    scheme = "https" if config.https else "http"
    url = f"{scheme}://{'[' + host + ']' if ':' in host else host}:{port}/"

    def ready() -> None:
        _log.info("the console serves %s (gateway %s)", url, config.gateway)
        path = os.environ.get(READY_FILE_ENV)
        if path:
            write_ready_file(path, {"listen": f"{host}:{port}", "url": url, "pid": os.getpid()})

    try:
        app = create_app(config, on_ready=ready)
    except (OSError, ValueError) as exc:
        print(f"tide console: {exc}", file=sys.stderr)
        return 2
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            log_level=config.log_level,
            ssl_certfile=config.tls_cert_file,
            ssl_keyfile=config.tls_key_file,
            access_log=False,
            proxy_headers=False,
        )
    )
    # uvicorn stops cleanly on SIGTERM / SIGINT, then raises the signal again to the
    # handlers it found: with these, that ends in a status 0 (as the other services).
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stopped)
    server.run(sockets=[sock])
    return 0


def _stopped(signum: int, frame: FrameType | None) -> None:
    _log.info("%s: the console stopped", signal.Signals(signum).name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
