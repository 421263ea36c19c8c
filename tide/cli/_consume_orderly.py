"""``tide consume --orderly``: consume as one orderly member of the group.

Unlike the plain ``tide consume`` (a standalone reader of every queue), this joins the
group as an orderly PushConsumer (docs/client.md "Ordering"): it gets its share of the
topic's queues, locks each at its broker before reading it, and prints each queue's
messages one at a time in queue order, committing after printing. With ``--count N`` a
message past the N-th is answered RECONSUME_LATER and the member stops before its
retry: it is not committed and stays for the group.
"""

from __future__ import annotations

import argparse
import sys
import threading

from tide.cli._common import client_tls
from tide.cli._output import MessagePrinter
from tide.client import ConsumeResult, InvalidArgument, PushConsumer, ReceivedMessage

# Ctrl-C and --count are looked at this often.
WAKE_INTERVAL_S = 0.2


def consume_from(start_kind: str, start_value: int) -> str | int:
    """``--from`` as PushConsumer's consume_from (for queues without a committed offset)."""
    if start_kind in ("committed", "last"):
        return "last"
    if start_kind == "first":
        return "first"
    if start_kind == "time":
        return start_value
    raise InvalidArgument("--orderly: --from offset N is not supported; give first, last or time")


class _Printer:
    """Prints messages from the queue workers' threads, one at a time, up to a count."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._out = MessagePrinter(args.output or (sys.stdout if args.json else None))
        self._count: int | None = args.count
        self._lock = threading.Lock()
        self.printed = 0
        self.done = threading.Event()

    def __call__(self, message: ReceivedMessage) -> ConsumeResult:
        with self._lock:
            if self._count is not None and self.printed >= self._count:
                self.done.set()
                return ConsumeResult.RECONSUME_LATER  # not committed (module doc)
            self._out.write(message)
            self._out.flush()
            self.printed += 1
            if self._count is not None and self.printed >= self._count:
                self.done.set()
            return ConsumeResult.SUCCESS


def follow_orderly(args: argparse.Namespace, start_kind: str, start_value: int) -> int:
    """Consume until --count messages were printed or Ctrl-C; the count printed."""
    printer = _Printer(args)
    consumer = PushConsumer(
        args.group,
        args.topic,
        args.expression,
        printer,
        args.gateway,
        tls=client_tls(args),
        orderly=True,
        consume_from=consume_from(start_kind, start_value),
        long_poll_timeout_ms=args.long_poll_ms,
    )
    with consumer:
        try:
            while not printer.done.wait(WAKE_INTERVAL_S):
                pass
        except KeyboardInterrupt:
            pass  # the with block commits what was printed and leaves the group
    return printer.printed
