"""``tide recall MSG_ID``: cancel a timed message before it is due (RocketMQ 5's recall)."""

from __future__ import annotations

import argparse

from tide.cli._common import EXIT_OK, client_tls, gateway_parent, guarded
from tide.cli._output import dumps, utc_time
from tide.client import Admin


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    recall = subparsers.add_parser(
        "recall",
        parents=[gateway_parent()],
        help="cancel a timed message before it is due, by the msg id produce printed",
    )
    recall.add_argument("msg_id", metavar="MSG_ID")
    recall.set_defaults(handler=guarded(_recall))


def _recall(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        recalled = admin.recall(args.msg_id)
    if args.json:
        print(dumps({"unique_key": recalled.unique_key, "deliver_at_ms": recalled.deliver_at_ms}))
    else:
        print(f"recalled {recalled.unique_key} (it was due at {utc_time(recalled.deliver_at_ms)})")
    return EXIT_OK
