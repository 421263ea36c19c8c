"""``tide transactions list``: unresolved half messages (docs/client.md, "Transactions"):
their producer group, real topic, transaction id, age and the checks made so far."""

from __future__ import annotations

import argparse
import sys
import time

from tide.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    client_tls,
    gateway_parent,
    guarded,
    positive_int,
)
from tide.cli._output import Cell, dumps, table, utc_time
from tide.client import Admin, HalfMessage

DEFAULT_LIST_MAX = 1000
MAX_LIST_MAX = 10_000
LIST_HEADERS = ["BROKER", "GROUP", "TOPIC", "TRANSACTION ID", "MSG ID", "AGE S", "CHECKS"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = gateway_parent()
    transactions = subparsers.add_parser(
        "transactions", help="transactional messages: list the unresolved half messages"
    )
    commands = transactions.add_subparsers(
        dest="transactions_command", metavar="SUBCOMMAND", required=True
    )
    listing = commands.add_parser(
        "list", parents=[parent], help="unresolved half messages, their age and checks"
    )
    listing.add_argument("--group", default="", help="only this producer group's")
    listing.add_argument(
        "--max",
        type=positive_int,
        default=DEFAULT_LIST_MAX,
        metavar="N",
        help=f"at most N per broker, oldest first (1..{MAX_LIST_MAX}; default {DEFAULT_LIST_MAX})",
    )
    listing.set_defaults(handler=guarded(_list))


def _list(args: argparse.Namespace) -> int:
    if args.max > MAX_LIST_MAX:
        print(f"tide transactions list: --max {args.max} is past {MAX_LIST_MAX}", file=sys.stderr)
        return EXIT_FAILURE
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        halves = admin.list_transactions(args.group, args.max)
    now_ms = time.time_ns() // 1_000_000
    if args.json:
        print(dumps({"halves": [_json(half, now_ms) for half in halves]}))
        return EXIT_OK
    if not halves:
        print("no unresolved half messages", file=sys.stderr)
        return EXIT_OK
    rows: list[list[Cell]] = [
        [
            half.broker_name,
            half.producer_group,
            half.topic,
            half.transaction_id,
            half.msg_id,
            _age_s(half, now_ms),
            half.checks,
        ]
        for half in halves
    ]
    print(table(LIST_HEADERS, rows))
    return EXIT_OK


def _age_s(half: HalfMessage, now_ms: int) -> int:
    return max(0, now_ms - half.store_timestamp_ms) // 1000


def _json(half: HalfMessage, now_ms: int) -> dict[str, object]:
    return {
        "broker_name": half.broker_name,
        "producer_group": half.producer_group,
        "topic": half.topic,
        "transaction_id": half.transaction_id,
        "unique_key": half.unique_key,
        "msg_id": half.msg_id,
        "queue_offset": half.queue_offset,
        "stored": utc_time(half.store_timestamp_ms),
        "age_s": _age_s(half, now_ms),
        "checks": half.checks,
    }
