"""``tide consume``: follow every queue of a topic with long polling, print, commit.

One long-poll pull is in flight per queue (gRPC futures, no thread per queue); each
answer is printed and its queue's offset committed for the group before the queue is
pulled again. This is a standalone reader, not a group member: it reads every queue of
the topic as routed at start, so do not run it beside push consumers of the same group.

A commit that fails UNAVAILABLE (the broker's master is down: consumer offsets live on
the master, while pulls go on from its slave) does not stop it: the position is kept,
one warning per queue and outage is logged, and the commit is tried again with the
queue's next answer (at most every COMMIT_RETRY_INTERVAL_S) and on the way out.

Ctrl-C (SIGINT) sets a flag the loop looks at between answers (within WAKE_INTERVAL_S)
instead of raising KeyboardInterrupt wherever the program happens to be: raised between
printing an answer and recording the queue's new position, it made the way out commit
less than was printed. So every message printed is committed, then it exits 130; a
second Ctrl-C interrupts at once (e.g. a commit that hangs).
"""

from __future__ import annotations

import argparse
import functools
import logging
import queue as queue_module
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType, TracebackType

import grpc

from tide.cli._common import (
    EXIT_OK,
    EXIT_USAGE,
    client_tls,
    gateway_parent,
    guarded,
    non_negative_int,
    positive_int,
)
from tide.cli._consume_orderly import consume_from, follow_orderly
from tide.cli._output import MessagePrinter
from tide.client import (
    ConsumeFrom,
    FailedPrecondition,
    InvalidArgument,
    MessageQueue,
    PullStatus,
    TideError,
    Unavailable,
)
from tide.client._convert import check_group, from_pull_response
from tide.client._errors import error_from_rpc
from tide.client._pull_consumer import MAX_LONG_POLL_TIMEOUT_MS, GatewayReader
from tide.client._rpc import Connection
from tide.client._types import PullResult
from tide.v1 import gateway_pb2

_log = logging.getLogger("tide.cli.consume")

WAKE_INTERVAL_S = 0.2
MAX_ERROR_BACKOFF_S = 5.0
PULL_BATCH = 32
COMMIT_RETRY_INTERVAL_S = 1.0

_DESCRIPTION = """\
Print the messages of every queue of TOPIC as they arrive (long polling) until Ctrl-C or
--count messages, committing the group's offsets after printing.

Where each queue starts:
  (default)        the group's committed offset; with none, the queue's end ("last")
  --from first     the oldest stored message
  --from last      the queue's end: only messages sent from now on
  --from offset N  queue offset N in every queue (clamped into the queue)
  --from time T    the first message stored at or after T (ms since epoch or ISO-8601)"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "consume",
        parents=[gateway_parent()],
        help="follow a topic's messages and commit the group's offsets",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("group", metavar="GROUP")
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument(
        "--from",
        dest="start",
        nargs="+",
        metavar="WHERE",
        help="first | last | offset N | time T (see above)",
    )
    parser.add_argument("--count", type=positive_int, metavar="N", help="stop after N messages")
    parser.add_argument(
        "--expression", default="*", metavar="EXPR", help='tags filter, e.g. "A || B"'
    )
    parser.add_argument(
        "--output", type=argparse.FileType("w"), metavar="FILE", help="write JSON lines to FILE"
    )
    parser.add_argument(
        "--long-poll-ms",
        type=non_negative_int,
        default=15_000,
        metavar="MS",
        help=f"how long one pull waits for news (0..{MAX_LONG_POLL_TIMEOUT_MS}, default 15000)",
    )
    parser.add_argument(
        "--no-commit", action="store_true", help="do not commit offsets (browse only)"
    )
    parser.add_argument(
        "--orderly",
        action="store_true",
        help="consume as an orderly member of GROUP: its share of the queues, each locked "
        "at its broker and printed one message at a time in queue order (docs/client.md)",
    )
    parser.set_defaults(handler=guarded(_run))


@dataclass(frozen=True)
class Start:
    """Where ``tide consume`` starts in each queue."""

    kind: str  # "committed", "first", "last", "offset", "time"
    value: int = 0


def parse_start(words: list[str] | None) -> Start:
    """``--from`` words as a Start; raises InvalidArgument with what to give."""
    if not words:
        return Start("committed")
    kind, rest = words[0], words[1:]
    if kind in ("first", "last") and not rest:
        return Start(kind)
    if kind == "offset" and len(rest) == 1:
        try:
            offset = int(rest[0])
        except ValueError:
            offset = -1
        if offset >= 0:
            return Start("offset", offset)
    if kind == "time" and len(rest) == 1:
        return Start("time", ConsumeFrom.parse(rest[0]).timestamp_ms)
    raise InvalidArgument(
        f"--from {' '.join(words)}: give first, last, offset N (N >= 0) or time T "
        "(ms since epoch or ISO-8601)"
    )


def start_position(
    start: Start,
    committed: Callable[[], int],
    bounds: tuple[int, int],
    search: Callable[[int], int],
) -> int:
    """The first offset to read in a queue with offsets ``bounds`` = (min, max)."""
    low, high = bounds
    if start.kind == "committed":
        value = committed()
        return high if value < 0 else min(max(value, low), high)
    if start.kind == "first":
        return low
    if start.kind == "last":
        return high
    if start.kind == "offset":
        return min(max(start.value, low), high)
    return min(max(search(start.value), low), high)


def _print_result(printer: MessagePrinter, result: PullResult, limit: int | None) -> int:
    """Print up to ``limit`` of the result's messages; how many were printed."""
    messages = result.messages if limit is None else result.messages[:limit]
    for message in messages:
        printer.write(message)
    printer.flush()
    return len(messages)


def _run(args: argparse.Namespace) -> int:
    try:
        start = parse_start(args.start)
        check_group(args.group)
        if args.long_poll_ms > MAX_LONG_POLL_TIMEOUT_MS:
            raise InvalidArgument(f"--long-poll-ms is over {MAX_LONG_POLL_TIMEOUT_MS}")
        if args.orderly and args.no_commit:
            raise InvalidArgument("--orderly commits; drop --no-commit")
        if args.orderly:
            consume_from(start.kind, start.value)  # --from as the orderly member takes it
    except InvalidArgument as exc:
        print(f"tide consume: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.orderly:
            consumed = follow_orderly(args, start.kind, start.value)
        else:
            consumed = _follow_plain(args, start)
    finally:
        if args.output is not None:
            args.output.close()
    if args.output is not None or not args.json:
        print(f"consumed {consumed} messages", file=sys.stderr)
    return EXIT_OK


def _follow_plain(args: argparse.Namespace, start: Start) -> int:
    reader = GatewayReader(Connection(args.gateway, tls=client_tls(args)))
    try:
        return _follow(args, reader, start)
    finally:
        reader.connection.close()


def _start_positions(
    args: argparse.Namespace, reader: GatewayReader, start: Start
) -> dict[MessageQueue, int]:
    queues = reader.queues(args.topic)
    if not queues:
        raise FailedPrecondition(f"topic {args.topic!r} has no readable queue on any broker")
    positions: dict[MessageQueue, int] = {}
    for mq in queues:
        offsets = reader.offsets(mq)
        positions[mq] = start_position(
            start,
            functools.partial(reader.committed, args.group, mq),
            (offsets.min_offset, offsets.max_offset),
            functools.partial(reader.search_offset, mq),
        )
    return positions


class _Commits:
    """The group's offsets as committed by ``tide consume``; a queue whose commit failed
    UNAVAILABLE keeps its position and is tried again later."""

    def __init__(self, reader: GatewayReader, group: str) -> None:
        self._reader = reader
        self._group = group
        self.committed: dict[MessageQueue, int] = {}
        self._failing_since: dict[MessageQueue, float] = {}  # queue -> last failed attempt

    def commit(self, mq: MessageQueue, position: int) -> None:
        """Commit ``position`` unless it is committed already or the queue's last attempt
        failed less than COMMIT_RETRY_INTERVAL_S ago; raises errors other than UNAVAILABLE."""
        if self.committed.get(mq) == position:
            return
        failed_at = self._failing_since.get(mq)
        if failed_at is not None and time.monotonic() - failed_at < COMMIT_RETRY_INTERVAL_S:
            return
        try:
            self._reader.try_commit(self._group, mq, position)
        except Unavailable as exc:
            if failed_at is None:
                _log.warning(
                    "offset %d of %s not committed: %s; consuming goes on and the offset is "
                    "committed when it can be (not logged again for this queue until then)",
                    position,
                    mq,
                    exc,
                )
            self._failing_since[mq] = time.monotonic()
            return
        if failed_at is not None:
            _log.info("offset %d of %s committed again", position, mq)
            del self._failing_since[mq]
        self.committed[mq] = position


class _Interrupt:
    """While entered (in the main thread): the first SIGINT sets ``requested`` and puts
    back Python's default handler, so that a second one raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Callable[[int, FrameType | None], object] | int | None = None
        self._installed = False

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._installed:
            previous = self._previous
            # None: the handler was not set from Python; Python's own is the nearest.
            signal.signal(
                signal.SIGINT, signal.default_int_handler if previous is None else previous
            )


def _follow(args: argparse.Namespace, reader: GatewayReader, start: Start) -> int:
    """Follow, print, commit; raises KeyboardInterrupt after committing what was printed
    when Ctrl-C stopped it."""
    positions = _start_positions(args, reader, start)
    with _Interrupt() as interrupt:
        consumed = _follow_from(args, reader, positions, interrupt)
    if interrupt.requested:
        raise KeyboardInterrupt
    return consumed


def _follow_from(
    args: argparse.Namespace,
    reader: GatewayReader,
    positions: dict[MessageQueue, int],
    interrupt: _Interrupt,
) -> int:
    printer = MessagePrinter(args.output or (sys.stdout if args.json else None))
    done: queue_module.Queue[tuple[MessageQueue, grpc.Future[gateway_pb2.PullResponse]]]
    done = queue_module.Queue()
    in_flight: dict[MessageQueue, grpc.Future[gateway_pb2.PullResponse]] = {}
    retry_at: dict[MessageQueue, float] = {}
    failures: dict[MessageQueue, int] = {}
    commits = _Commits(reader, args.group)
    consumed = 0

    def issue(mq: MessageQueue) -> None:
        request = reader.pull_request(
            args.group, mq, positions[mq], PULL_BATCH, args.expression, args.long_poll_ms
        )
        future = reader.pull_future(request)
        in_flight[mq] = future
        future.add_done_callback(lambda f: done.put((mq, f)))

    try:
        for mq in positions:
            issue(mq)
        while (args.count is None or consumed < args.count) and not interrupt.requested:
            now = time.monotonic()
            for mq in [q for q, at in retry_at.items() if at <= now]:
                del retry_at[mq]
                issue(mq)
            try:
                mq, future = done.get(timeout=WAKE_INTERVAL_S)
            except queue_module.Empty:
                continue
            in_flight.pop(mq, None)
            try:
                result = from_pull_response(mq, future.result())
            except grpc.RpcError as exc:
                error: TideError = error_from_rpc(exc, f"Pull from {mq} at {positions[mq]}")
                failures[mq] = failures.get(mq, 0) + 1
                wait_s = min(0.2 * failures[mq], MAX_ERROR_BACKOFF_S)
                _log.warning("%s; again in %.1f s", error, wait_s)
                retry_at[mq] = time.monotonic() + wait_s
                continue
            failures.pop(mq, None)
            limit = None if args.count is None else args.count - consumed
            printed = _print_result(printer, result, limit)
            consumed += printed
            positions[mq] = _next_position(result, printed, positions[mq])
            if not args.no_commit:
                commits.commit(mq, positions[mq])
            if args.count is None or consumed < args.count:
                issue(mq)
    finally:
        for future in in_flight.values():
            future.cancel()
        if not args.no_commit:
            _commit_rest(args, reader, positions, commits.committed)
    return consumed


def _commit_rest(
    args: argparse.Namespace,
    reader: GatewayReader,
    positions: dict[MessageQueue, int],
    committed: dict[MessageQueue, int],
) -> None:
    """On the way out (--count reached, Ctrl-C, an error): commit what was printed but not
    yet committed; a failure is reported, not raised over the original exit."""
    for mq, position in positions.items():
        if committed.get(mq) == position:
            continue
        try:
            reader.commit(args.group, mq, position)
        except TideError as exc:
            warning = f"offset {position} of {mq} not committed: {exc}"
            print(f"tide consume: warning: {warning}", file=sys.stderr)
        else:
            committed[mq] = position


def _next_position(result: PullResult, printed: int, current: int) -> int:
    if result.status is PullStatus.OFFSET_ILLEGAL:
        _log.warning(
            "offset %d is outside %d..%d; continuing at %d",
            current,
            result.min_offset,
            result.max_offset,
            result.next_offset,
        )
        return result.next_offset
    if printed < len(result.messages):
        return result.messages[printed - 1].queue_offset + 1 if printed else current
    return result.next_offset
