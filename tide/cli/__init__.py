"""The ``tide`` command line: one module per command group, each with ``add_parser``.

A command module registers its subcommand(s) on the top-level subparsers and sets a
``handler`` default: ``handler(args) -> int`` (the exit code). To add a command group,
write ``tide/cli/_<name>.py`` with ``add_parser`` and list it in ``_COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Protocol

from tide.grpc_defaults import use_tide_grpc_defaults

use_tide_grpc_defaults()  # before the commands import grpc (tide/grpc_defaults.py)

from tide.cli import (  # noqa: E402
    _auth,
    _bench,
    _cluster,
    _console,
    _consume,
    _dlq,
    _group,
    _offsets,
    _produce,
    _query,
    _recall,
    _receive,
    _store,
    _topic,
    _transactions,
    _up,
)

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a killed writer

Handler = Callable[[argparse.Namespace], int]


class CommandModule(Protocol):
    def add_parser(self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Add this module's subcommand(s); each sets ``handler`` via ``set_defaults``."""


_COMMAND_MODULES: tuple[CommandModule, ...] = (
    _store,
    _up,
    _topic,
    _group,
    _cluster,
    _produce,
    _consume,
    _receive,
    _query,
    _recall,
    _offsets,
    _dlq,
    _transactions,
    _bench,
    _auth,
    _console,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tide", description="Tide: a message queue on RocketMQ's storage design."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _COMMAND_MODULES:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tide`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["console"]:
        # Every option is the console's own (argparse would take --help for tide's).
        return _console.run_console(args_list[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    handler: Handler = args.handler
    try:
        return handler(args)
    except BrokenPipeError:
        # The reader went away (``tide consume ... | head``): stop quietly, as Unix tools
        # do. Point stdout at /dev/null so the interpreter's final flush cannot fail too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


__all__ = ["build_parser", "main"]
