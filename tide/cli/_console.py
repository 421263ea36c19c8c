"""``tide console [OPTIONS]``: the web console (docs/console.md).

The console lives in ``services/console`` (tide never imports services): this command
runs it as ``python -m services.console`` in place of the ``tide`` process, with the
options given (``tide console --help`` lists them).
"""

from __future__ import annotations

import argparse
import os
import sys

CONSOLE_MODULE = "services.console"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "console",
        help="serve the web console (options: tide console --help)",
        add_help=False,
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("options", nargs=argparse.REMAINDER)
    parser.set_defaults(handler=run)


def command(options: list[str]) -> list[str]:
    """The console's command line."""
    return [sys.executable, "-m", CONSOLE_MODULE, *options]


def run(args: argparse.Namespace) -> int:
    return run_console(list(args.options))


def run_console(options: list[str]) -> int:
    argv = command(options)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)  # never returns: the console is this process now
