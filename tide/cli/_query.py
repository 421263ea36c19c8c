"""``tide query id|key|uniq``: find messages by message id, key or unique key."""

from __future__ import annotations

import argparse
import sys

from tide.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    client_tls,
    gateway_parent,
    guarded,
    positive_int,
)
from tide.cli._output import (
    MESSAGE_HEADERS,
    Cell,
    body_preview,
    dumps,
    message_json,
    message_row,
    table,
    utc_time,
)
from tide.client import Admin, ConsumeFrom, ReceivedMessage
from tide.client._admin import MAX_QUERY_MAX


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = gateway_parent()
    query = subparsers.add_parser("query", help="find messages by id, key or unique key")
    commands = query.add_subparsers(dest="query_command", metavar="SUBCOMMAND", required=True)

    by_id = commands.add_parser(
        "id", parents=[parent], help="the message with an offset message id (as produce prints)"
    )
    by_id.add_argument("msg_id", metavar="MSG_ID")
    by_id.set_defaults(handler=guarded(_by_id))

    by_key = commands.add_parser(
        "key", parents=[parent], help="messages of a topic with a key, newest first"
    )
    by_key.add_argument("topic", metavar="TOPIC")
    by_key.add_argument("key", metavar="KEY")
    by_key.add_argument(
        "--max", type=positive_int, default=64, metavar="N", help=f"1..{MAX_QUERY_MAX}"
    )
    by_key.add_argument("--begin", metavar="TIME", help="stored at or after (ms or ISO-8601)")
    by_key.add_argument("--end", metavar="TIME", help="stored at or before (ms or ISO-8601)")
    by_key.set_defaults(handler=guarded(_by_key))

    by_uniq = commands.add_parser(
        "uniq", parents=[parent], help="messages of a topic with a unique key (UNIQ_KEY)"
    )
    by_uniq.add_argument("topic", metavar="TOPIC")
    by_uniq.add_argument("unique_key", metavar="UNIQUE_KEY")
    by_uniq.set_defaults(handler=guarded(_by_uniq))


def detail_rows(message: ReceivedMessage) -> list[list[Cell]]:
    """One message as FIELD / VALUE rows."""
    user = {k: v for k, v in message.properties.items() if k not in ("TAGS", "KEYS", "UNIQ_KEY")}
    return [
        ["topic", message.topic],
        ["broker", message.queue.broker_name],
        ["queue id", str(message.queue.queue_id)],
        ["queue offset", str(message.queue_offset)],
        ["msg id", message.msg_id],
        ["unique key", message.unique_key],
        ["tags", message.tags],
        ["keys", " ".join(message.keys)],
        ["properties", dumps(user) if user else ""],
        ["born", f"{utc_time(message.born_timestamp_ms)} from {message.born_host}"],
        ["stored", f"{utc_time(message.store_timestamp_ms)} on {message.store_host}"],
        ["reconsume times", str(message.reconsume_times)],
        ["physical offset", str(message.physical_offset)],
        ["size", f"{message.size_bytes} bytes ({len(message.body)} body)"],
        ["body", body_preview(message.body, limit=200)],
    ]


def _by_id(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        message = admin.query_id(args.msg_id)
    if args.json:
        print(dumps(message_json(message)))
    else:
        print(table(["FIELD", "VALUE"], detail_rows(message)))
    return EXIT_OK


def _by_key(args: argparse.Namespace) -> int:
    begin = ConsumeFrom.parse(args.begin).timestamp_ms if args.begin else 0
    end = ConsumeFrom.parse(args.end).timestamp_ms if args.end else 0
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        messages = admin.query_key(
            args.topic, args.key, max_count=args.max, begin_ms=begin, end_ms=end
        )
    return _print_messages(args, messages, f"key {args.key!r}")


def _by_uniq(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        messages = admin.query_unique_key(args.topic, args.unique_key)
    return _print_messages(args, messages, f"unique key {args.unique_key!r}")


def _print_messages(args: argparse.Namespace, messages: list[ReceivedMessage], what: str) -> int:
    if args.json:
        print(dumps({"messages": [message_json(m) for m in messages]}))
    elif messages:
        print(table(MESSAGE_HEADERS, [message_row(m) for m in messages]))
    if not messages:
        print(f"tide query: no message of topic {args.topic} with {what}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK
