"""``tide produce``: send test or scripted messages to a topic."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tide.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    client_tls,
    gateway_parent,
    guarded,
    positive_int,
)
from tide.cli._delay import add_delay_options
from tide.cli._output import Cell, ProgressBar, dumps, table
from tide.client import MAX_BATCH_MESSAGES, Message, Producer, SendResult
from tide.limits import MESSAGE_BODY_MAX_BYTES

# Any body a gateway may be configured to take (it checks its own limit).
MAX_BODY_BYTES = MESSAGE_BODY_MAX_BYTES
DEFAULT_BODY = "message {i}"

_DESCRIPTION = """\
Send --count messages to TOPIC. The body, keys and sharding key are templates: {i} becomes
the message's index (0-based). --size pads (or cuts) each body to exactly N bytes.
Prints a summary per queue, or with --json one JSON line per message. A progress bar goes
to stderr when it is a terminal. Exit 1 when a message was not written.
--delay-level, --deliver-at or --delay (one of them) deliver the messages later; the
offsets printed are then those of the stored (scheduled) copies."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "produce",
        parents=[gateway_parent()],
        help="send messages to a topic",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument(
        "--count", type=positive_int, default=1, metavar="N", help="messages (default 1)"
    )
    parser.add_argument(
        "--body", default=DEFAULT_BODY, metavar="TEMPLATE", help=f"default {DEFAULT_BODY!r}"
    )
    parser.add_argument("--size", type=_body_size, metavar="BYTES", help="exact body size")
    parser.add_argument(
        "--keys", action="append", default=[], metavar="TEMPLATE", help="a key (repeatable)"
    )
    parser.add_argument("--tags", default="", metavar="TAG", help="the message tag")
    parser.add_argument(
        "--property",
        action="append",
        default=[],
        type=_property,
        metavar="NAME=VALUE",
        help="a user property (repeatable)",
    )
    parser.add_argument("--sharding-key", metavar="TEMPLATE", help="route by this key")
    add_delay_options(parser)
    parser.add_argument("--rate", type=_rate, metavar="MSGS_PER_S", help="limit the send rate")
    parser.add_argument(
        "--batch",
        type=_batch,
        default=1,
        metavar="N",
        help=f"messages per request (1..{MAX_BATCH_MESSAGES}, default 1)",
    )
    parser.add_argument(
        "--progress", action="store_true", help="show the progress bar even if stderr is no TTY"
    )
    parser.set_defaults(handler=guarded(_run))


def _body_size(text: str) -> int:
    value = positive_int(text)
    if value > MAX_BODY_BYTES:
        raise argparse.ArgumentTypeError(f"{value} is over {MAX_BODY_BYTES} bytes")
    return value


def _batch(text: str) -> int:
    value = positive_int(text)
    if value > MAX_BATCH_MESSAGES:
        raise argparse.ArgumentTypeError(f"{value} is over {MAX_BATCH_MESSAGES}")
    return value


def _rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _property(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def render(template: str, index: int) -> str:
    return template.replace("{i}", str(index))


def make_body(template: str, index: int, size: int | None) -> bytes:
    """The body of message ``index``: the template, padded with '.' or cut to ``size``."""
    body = render(template, index).encode("utf-8")
    if size is None:
        return body
    return body[:size].ljust(size, b".")


def build_message(args: argparse.Namespace, index: int) -> Message:
    return Message(
        args.topic,
        make_body(args.body, index, args.size),
        tags=args.tags,
        keys=[render(k, index) for k in args.keys],
        properties=dict(args.property),
        sharding_key=render(args.sharding_key, index) if args.sharding_key else None,
        delay_level=args.delay_level,
        deliver_at_ms=args.deliver_at,
        delay_ms=args.delay,
    )


@dataclass
class _QueueStats:
    sent: int = 0
    first_offset: int = -1
    last_offset: int = -1


@dataclass
class Summary:
    """What was sent, per (broker, queue id)."""

    queues: dict[tuple[str, int], _QueueStats] = field(default_factory=dict)
    failed: int = 0

    def add(self, result: SendResult) -> None:
        if not result.written:
            self.failed += 1
            return
        stats = self.queues.setdefault(
            (result.queue.broker_name, result.queue.queue_id), _QueueStats()
        )
        stats.sent += 1
        if stats.first_offset < 0:
            stats.first_offset = result.queue_offset
        stats.last_offset = result.queue_offset

    @property
    def sent(self) -> int:
        return sum(s.sent for s in self.queues.values())

    def rows(self) -> list[list[Cell]]:
        return [
            [broker, queue_id, s.sent, s.first_offset, s.last_offset]
            for (broker, queue_id), s in sorted(self.queues.items())
        ]


def result_json(index: int, result: SendResult) -> dict[str, Any]:
    return {
        "index": index,
        "status": result.status.value,
        "msg_id": result.msg_id,
        "unique_key": result.unique_key,
        "topic": result.queue.topic,
        "broker_name": result.queue.broker_name,
        "queue_id": result.queue.queue_id,
        "queue_offset": result.queue_offset,
        "store_timestamp_ms": result.store_timestamp_ms,
        "error": result.error,
    }


def _run(args: argparse.Namespace) -> int:
    summary = Summary()
    bar = ProgressBar(sys.stderr, args.count, enabled=args.progress or sys.stderr.isatty())
    started = time.monotonic()
    with Producer(args.gateway, tls=client_tls(args)) as producer:
        try:
            for first in range(0, args.count, args.batch):
                if args.rate is not None:
                    _pace(started, first, args.rate)
                indexes = range(first, min(first + args.batch, args.count))
                results = producer.send_batch([build_message(args, i) for i in indexes])
                _report(args, indexes, results, summary)
                bar.update(summary.sent + summary.failed)
        finally:
            bar.finish()
            if not args.json:
                _print_summary(summary, time.monotonic() - started)
    return EXIT_OK if summary.failed == 0 else EXIT_FAILURE


def _pace(started: float, index: int, rate: float) -> None:
    wait_s = started + index / rate - time.monotonic()
    if wait_s > 0:
        time.sleep(wait_s)


def _report(
    args: argparse.Namespace,
    indexes: Sequence[int],
    results: Sequence[SendResult],
    summary: Summary,
) -> None:
    for index, result in zip(indexes, results, strict=True):
        summary.add(result)
        if args.json:
            print(dumps(result_json(index, result)))
        elif not result.written:
            print(f"message {index} not written: {result.error}", file=sys.stderr)


def _print_summary(summary: Summary, elapsed_s: float) -> None:
    if summary.queues:
        print(table(["BROKER", "QUEUE", "SENT", "FIRST OFFSET", "LAST OFFSET"], summary.rows()))
    rate = summary.sent / elapsed_s if elapsed_s > 0 else 0.0
    line = f"sent {summary.sent} messages in {elapsed_s:.2f} s ({rate:.0f} msg/s)"
    if summary.failed:
        line += f", {summary.failed} not written"
    print(line)
