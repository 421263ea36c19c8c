"""What every gateway command shares: --gateway / TIDE_GATEWAY, --json, error handling."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from tide.auth.client import ACCESS_KEY_ENV, SECRET_KEY_ENV
from tide.client import (
    DEFAULT_GATEWAY,
    ClientTls,
    InvalidArgument,
    TideError,
    TlsFiles,
    Unavailable,
)

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
GATEWAY_ENV = "TIDE_GATEWAY"
# TLS to the gateway (docs/security.md): TIDE_TLS=1 or any of the files turns it on.
TLS_ENV = "TIDE_TLS"
TLS_FILE_ENVS = {
    "ca_file": "TIDE_TLS_CA_FILE",
    "cert_file": "TIDE_TLS_CERT_FILE",
    "key_file": "TIDE_TLS_KEY_FILE",
}
TLS_FILE_HELP = {
    "ca_file": "PEM CA bundle that verifies the gateway (default: the system's roots)",
    "cert_file": "PEM client certificate (with --tls-key-file), when the gateway asks one",
    "key_file": "PEM private key of --tls-cert-file",
}


def default_gateway() -> str:
    return os.environ.get(GATEWAY_ENV) or DEFAULT_GATEWAY


def gateway_parent() -> argparse.ArgumentParser:
    """A parent parser with --gateway and --json, for ``parents=[...]``."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--gateway",
        default=default_gateway(),
        metavar="HOST:PORT",
        help=f"the gateway (default: ${GATEWAY_ENV} or {DEFAULT_GATEWAY})",
    )
    parent.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parent.add_argument(
        "--access-key",
        default=os.environ.get(ACCESS_KEY_ENV, ""),
        help=f"sign calls as this user (a gateway with --auth-enabled; default ${ACCESS_KEY_ENV})",
    )
    parent.add_argument(
        "--secret-key-file",
        metavar="FILE",
        help=f"the user's secret key (default ${SECRET_KEY_ENV}; never a flag: ps shows flags)",
    )
    add_tls_arguments(parent)
    return parent


def add_tls_arguments(parser: argparse.ArgumentParser) -> None:
    """--tls and --tls-ca-file / --tls-cert-file / --tls-key-file (and their TIDE_TLS* env)."""
    parser.add_argument(
        "--tls",
        action="store_true",
        default=os.environ.get(TLS_ENV, "").lower() in ("1", "true", "yes", "on"),
        help=f"connect with TLS (default: ${TLS_ENV}; implied by any --tls-*-file)",
    )
    for name, env in TLS_FILE_ENVS.items():
        parser.add_argument(
            "--tls-" + name.replace("_", "-"),
            default=os.environ.get(env) or None,
            metavar="PATH",
            help=f"{TLS_FILE_HELP[name]} (default: ${env})",
        )


def client_tls(args: argparse.Namespace) -> ClientTls:
    """The ``tls=`` of tide.client from the --tls* arguments."""
    files = TlsFiles(
        cert_file=args.tls_cert_file, key_file=args.tls_key_file, ca_file=args.tls_ca_file
    )
    if files != TlsFiles():
        return files
    return bool(args.tls)


def apply_credentials(args: argparse.Namespace) -> None:
    """--access-key / --secret-key-file into the environment every client of this
    process reads (tide.client's Connection signs with TIDE_ACCESS_KEY/TIDE_SECRET_KEY)."""
    access_key = getattr(args, "access_key", "")
    secret_file = getattr(args, "secret_key_file", None)
    if access_key:
        os.environ[ACCESS_KEY_ENV] = access_key
    if secret_file:
        try:
            os.environ[SECRET_KEY_ENV] = Path(secret_file).read_text().strip()
        except OSError as exc:
            raise InvalidArgument(f"--secret-key-file {secret_file}: {exc.strerror}") from None


def guarded(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a command handler: a TideError is printed on one line (exit 1), Ctrl-C exits 130."""

    def run(args: argparse.Namespace) -> int:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        try:
            apply_credentials(args)
            return handler(args)
        except TideError as exc:
            hint = ""
            if isinstance(exc, Unavailable):
                hint = f" (is a gateway running at {args.gateway}? see --gateway / ${GATEWAY_ENV})"
            print(f"tide {args.command}: error: {exc}{hint}", file=sys.stderr)
            return EXIT_FAILURE
        except KeyboardInterrupt:
            print(f"tide {args.command}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED

    return run


def positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def non_negative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
