"""``tide dlq list|show|resend``: a consumer group's dead letters (``%DLQ%<group>``).

A dead-letter queue is write-only for consumers; these commands read it with
BrowseQueue, which commits nothing. ``resend`` produces each dead letter again to the
topic it was first produced to (DLQ_ORIGIN_TOPIC, else RETRY_TOPIC) with its body, tags,
keys, user properties and UNIQ_KEY; the dead letter stays in the queue (RocketMQ keeps
dead letters until retention deletes them), so resending twice delivers twice.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tide.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    client_tls,
    gateway_parent,
    guarded,
    positive_int,
)
from tide.cli._output import Cell, ProgressBar, body_preview, dumps, message_json, table, utc_time
from tide.client import Admin, NotFound, Producer, ReceivedMessage, TideError
from tide.dead_letters import DLQ_PREFIX, dead_letters, original_topic, resent_message

DEFAULT_LIST_MAX = 1000
MAX_LIST_MAX = 100_000
LIST_HEADERS = ["MSG ID", "ORIGINAL TOPIC", "UNIQUE KEY", "KEYS", "DEAD-LETTERED", "ATTEMPTS"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = gateway_parent()
    dlq = subparsers.add_parser(
        "dlq", help="a consumer group's dead letters: list, show, resend (%%DLQ%%<group>)"
    )
    commands = dlq.add_subparsers(dest="dlq_command", metavar="SUBCOMMAND", required=True)

    listing = commands.add_parser("list", parents=[parent], help="the group's dead letters")
    listing.add_argument("group", metavar="GROUP")
    listing.add_argument(
        "--max",
        type=positive_int,
        default=DEFAULT_LIST_MAX,
        metavar="N",
        help=f"list at most N, oldest first (1..{MAX_LIST_MAX}; default {DEFAULT_LIST_MAX})",
    )
    listing.set_defaults(handler=guarded(_list))

    show = commands.add_parser(
        "show", parents=[parent], help="one dead letter: its properties and body"
    )
    show.add_argument("group", metavar="GROUP")
    show.add_argument("msg_id", metavar="MSG_ID", help="as `tide dlq list` prints it")
    show.set_defaults(handler=guarded(_show))

    resend = commands.add_parser(
        "resend",
        parents=[parent],
        help="produce dead letters again to their original topic (they stay in the DLQ)",
    )
    resend.add_argument("group", metavar="GROUP")
    resend.add_argument("msg_ids", metavar="MSG_ID", nargs="*", help="as `tide dlq list` prints")
    resend.add_argument("--all", action="store_true", help="every dead letter of the group")
    resend.add_argument(
        "--progress", action="store_true", help="draw the progress bar even without a TTY"
    )
    resend.set_defaults(handler=guarded(_resend))


def _list(args: argparse.Namespace) -> int:
    if args.max > MAX_LIST_MAX:
        print(f"tide dlq list: --max {args.max} is past {MAX_LIST_MAX}", file=sys.stderr)
        return EXIT_FAILURE
    limit = args.max
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        messages = list(dead_letters(admin, args.group, limit))
    if args.json:
        print(dumps({"group": args.group, "dead_letters": [_json(m) for m in messages]}))
        return EXIT_OK
    if not messages:
        print(f"group {args.group} has no dead letters", file=sys.stderr)
        return EXIT_OK
    print(table(LIST_HEADERS, [_row(m) for m in messages]))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        message = _find(admin, args.group, args.msg_id)
    if args.json:
        print(dumps(_json(message)))
        return EXIT_OK
    rows: list[list[Cell]] = [
        ["msg id", message.msg_id],
        ["original topic", original_topic(message)],
        ["original msg id", message.properties.get("DLQ_ORIGIN_MESSAGE_ID", "")],
        ["unique key", message.unique_key],
        ["tags", message.tags],
        ["keys", " ".join(message.keys)],
        ["attempts", str(message.reconsume_times)],
        ["first stored", _first_stored(message)],
        ["dead-lettered", f"{utc_time(message.store_timestamp_ms)} on {message.store_host}"],
        ["broker", message.queue.broker_name],
    ]
    rows += [[f"property {name}", value] for name, value in sorted(message.properties.items())]
    rows.append(["body", f"{body_preview(message.body, limit=400)} ({len(message.body)} bytes)"])
    print(table(["FIELD", "VALUE"], rows))
    return EXIT_OK


def _resend(args: argparse.Namespace) -> int:
    if args.all == bool(args.msg_ids):
        print("tide dlq resend: give --all or one or more MSG_IDs (not both)", file=sys.stderr)
        return EXIT_FAILURE
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        if args.all:
            messages = list(dead_letters(admin, args.group, MAX_LIST_MAX))
            if len(messages) == MAX_LIST_MAX:
                print(
                    f"tide dlq resend: --all takes the first {MAX_LIST_MAX} dead letters; "
                    "run it again for the others (resent ones stay in the queue: give their "
                    "MSG_IDs instead to resend exactly those)",
                    file=sys.stderr,
                )
        else:
            messages = [_find(admin, args.group, msg_id) for msg_id in args.msg_ids]
    resent, failed = _produce_all(args, messages)
    print(
        f"resent {resent} of {len(messages)} dead letters of group {args.group} to their "
        f"original topics ({failed} failed); they stay in {DLQ_PREFIX}{args.group}",
        file=sys.stderr,
    )
    return EXIT_OK if not failed else EXIT_FAILURE


def _produce_all(args: argparse.Namespace, messages: Sequence[ReceivedMessage]) -> tuple[int, int]:
    bar = ProgressBar(sys.stderr, len(messages), enabled=args.progress or sys.stderr.isatty())
    resent = failed = 0
    with Producer(args.gateway, tls=client_tls(args)) as producer:
        for message in messages:
            topic = original_topic(message)
            try:
                if not topic:
                    raise TideError("it names no original topic (DLQ_ORIGIN_TOPIC)")
                result = producer.send_batch([resent_message(message, topic)])[0]
                if not result.written:
                    raise TideError(result.error)
            except TideError as exc:
                failed += 1
                bar.finish()
                print(f"tide dlq resend: {message.msg_id}: {exc}", file=sys.stderr)
            else:
                resent += 1
            bar.update(resent + failed)
    bar.finish()
    return resent, failed


def _find(admin: Admin, group: str, msg_id: str) -> ReceivedMessage:
    """The dead letter with this msg id; NotFound when it is not one of the group's."""
    message = admin.query_id(msg_id)
    if message.queue.topic != DLQ_PREFIX + group:
        raise NotFound(
            f"message {msg_id} is in topic {message.queue.topic}, not in {DLQ_PREFIX}{group}"
        )
    return message


def _first_stored(message: ReceivedMessage) -> str:
    stored = message.properties.get("ORIGIN_STORE_TIME", "")
    return utc_time(int(stored)) if stored.isdigit() else ""


def _row(message: ReceivedMessage) -> list[Cell]:
    return [
        message.msg_id,
        original_topic(message),
        message.unique_key,
        " ".join(message.keys),
        utc_time(message.store_timestamp_ms),
        message.reconsume_times,
    ]


def _json(message: ReceivedMessage) -> dict[str, object]:
    document: dict[str, object] = dict(message_json(message))
    document["original_topic"] = original_topic(message)
    document["attempts"] = message.reconsume_times
    return document
