"""``tide offsets``: per queue of a topic, its min/max offsets and a group's offset and lag."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from tide.cli._common import EXIT_OK, client_tls, gateway_parent, guarded
from tide.cli._output import Cell, dumps, table
from tide.client import MessageQueue, PullConsumer

# Reading offsets needs a group name on the wire; nothing is committed with it.
_READ_ONLY_GROUP = "tide-cli-offsets"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "offsets",
        parents=[gateway_parent()],
        help="min/max offset per queue; with --group its committed offset and lag",
        description="Per queue of TOPIC: broker, queue id, min offset, max offset (the next "
        "message's offset), and with --group the group's committed offset and lag (max minus "
        "committed; '-' when the group never committed for the queue).",
    )
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument("--group", metavar="GROUP", help="a consumer group")
    parser.set_defaults(handler=guarded(_run))


@dataclass(frozen=True)
class QueueReport:
    queue: MessageQueue
    min_offset: int
    max_offset: int
    # -1: the group never committed; None: no group asked about.
    group_offset: int | None

    @property
    def lag(self) -> int | None:
        if self.group_offset is None or self.group_offset < 0:
            return None
        return max(0, self.max_offset - self.group_offset)

    def row(self, *, with_group: bool) -> list[Cell]:
        row: list[Cell] = [
            self.queue.broker_name,
            self.queue.queue_id,
            self.min_offset,
            self.max_offset,
        ]
        if with_group:
            shown = self.group_offset if self.group_offset is not None else -1
            row += [shown if shown >= 0 else None, self.lag]
        return row

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "broker_name": self.queue.broker_name,
            "queue_id": self.queue.queue_id,
            "min_offset": self.min_offset,
            "max_offset": self.max_offset,
        }
        if self.group_offset is not None:
            document["group_offset"] = self.group_offset if self.group_offset >= 0 else None
            document["lag"] = self.lag
        return document


def render_table(reports: list[QueueReport], group: str | None) -> str:
    headers = ["BROKER", "QUEUE", "MIN", "MAX"]
    rows = [r.row(with_group=group is not None) for r in reports]
    if group is not None:
        headers += ["GROUP OFFSET", "LAG"]
        total = sum(r.lag or 0 for r in reports)
        rows.append(["total", None, None, None, None, total])
    return table(headers, rows)


def _run(args: argparse.Namespace) -> int:
    with PullConsumer(
        args.group or _READ_ONLY_GROUP, args.gateway, tls=client_tls(args)
    ) as consumer:
        reports = []
        for queue in consumer.queues(args.topic):
            offsets = consumer.offsets(queue)
            group_offset = consumer.committed(queue) if args.group else None
            reports.append(QueueReport(queue, offsets.min_offset, offsets.max_offset, group_offset))
    if args.json:
        document: dict[str, Any] = {"topic": args.topic, "group": args.group}
        document["queues"] = [r.to_json() for r in reports]
        if args.group:
            document["total_lag"] = sum(r.lag or 0 for r in reports)
        print(dumps(document))
    else:
        print(render_table(reports, args.group))
    return EXIT_OK
