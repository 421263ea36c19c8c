"""``tide receive``: POP consumption from the command line (docs/pop.md): receive a
topic's messages for a group, print them, ack them; until Ctrl-C or --count messages.

Any number of ``tide receive`` (and SimpleConsumers) of one group share the topic's
messages; a message printed but not acked (Ctrl-C between the two, ``--no-ack``) is
delivered again once its invisible time passes."""

from __future__ import annotations

import argparse

from tide.cli._common import (
    EXIT_OK,
    client_tls,
    gateway_parent,
    guarded,
    non_negative_int,
    positive_int,
)
from tide.cli._output import MessagePrinter
from tide.client import SimpleConsumer
from tide.client._simple_consumer import MAX_AWAIT_DURATION_MS
from tide.limits import POP_INVISIBLE_MAX_MS, POP_INVISIBLE_MIN_MS

RECEIVE_BATCH = 32


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "receive",
        parents=[gateway_parent()],
        help="receive a topic's messages for a group (POP), print and ack them",
        description="Receive TOPIC's messages for GROUP from the brokers (POP consumption: "
        "no offsets to commit, any number of receivers share them), print each and ack it, "
        "until Ctrl-C or --count messages.",
    )
    parser.add_argument("group", metavar="GROUP")
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("--count", type=positive_int, metavar="N", help="stop after N messages")
    parser.add_argument(
        "--expression", default="*", metavar="EXPR", help='tags filter, e.g. "A || B"'
    )
    parser.add_argument(
        "--output", type=argparse.FileType("w"), metavar="FILE", help="write JSON lines to FILE"
    )
    parser.add_argument(
        "--invisible-ms",
        type=positive_int,
        default=30_000,
        metavar="MS",
        help=f"how long a received message stays invisible to the group unless acked "
        f"({POP_INVISIBLE_MIN_MS}..{POP_INVISIBLE_MAX_MS}, default 30000)",
    )
    parser.add_argument(
        "--await-ms",
        type=non_negative_int,
        default=15_000,
        metavar="MS",
        help=f"how long one receive waits for news (0..{MAX_AWAIT_DURATION_MS}, default 15000)",
    )
    parser.add_argument(
        "--no-ack",
        action="store_true",
        help="print without acking (each message comes again after --invisible-ms)",
    )
    parser.set_defaults(handler=guarded(_run))


def _run(args: argparse.Namespace) -> int:
    printer = MessagePrinter(args.output)
    done = 0
    with SimpleConsumer(
        args.group,
        args.topic,
        args.expression,
        args.gateway,
        await_duration_ms=args.await_ms,
        tls=client_tls(args),
    ) as consumer:
        while args.count is None or done < args.count:
            wanted = RECEIVE_BATCH if args.count is None else min(RECEIVE_BATCH, args.count - done)
            messages = consumer.receive(wanted, args.invisible_ms)
            for message in messages:
                printer.write(message.message)
            printer.flush()
            if messages and not args.no_ack:
                consumer.ack_many(messages)
            done += len(messages)
    return EXIT_OK
