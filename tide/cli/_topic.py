"""``tide topic create|delete|list|route``: topic admin through the gateway."""

from __future__ import annotations

import argparse
from typing import Any

from tide.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    client_tls,
    gateway_parent,
    guarded,
    positive_int,
)
from tide.cli._output import dumps, table
from tide.client import Admin
from tide.v1 import nameserver_pb2

PERMS = {"rw": 6, "r": 4, "w": 2}
MESSAGE_TYPES = ("NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = gateway_parent()
    topic = subparsers.add_parser("topic", help="create, delete, list topics; show a route")
    commands = topic.add_subparsers(dest="topic_command", metavar="SUBCOMMAND", required=True)

    create = commands.add_parser(
        "create",
        parents=[parent],
        help="create or update a topic",
        description="Create (or update) a topic on the given brokers, on every master "
        "broker of --cluster, or (neither given) on every master broker.",
    )
    create.add_argument("topic", metavar="TOPIC")
    create.add_argument(
        "--queues", type=positive_int, default=4, metavar="N", help="queues per broker (default 4)"
    )
    create.add_argument(
        "--read-queues", type=positive_int, metavar="N", help="read queues (default --queues)"
    )
    create.add_argument(
        "--write-queues", type=positive_int, metavar="N", help="write queues (default --queues)"
    )
    create.add_argument(
        "--perm", choices=sorted(PERMS), default="rw", help="read/write permission (default rw)"
    )
    create.add_argument("--order", action="store_true", help="mark the topic as ordered")
    create.add_argument(
        "--message-type",
        type=str.upper,
        choices=MESSAGE_TYPES,
        default="",
        help="the messages the topic takes, checked on produce (default NORMAL; MIXED takes "
        "every type)",
    )
    create.add_argument(
        "--broker", action="append", default=[], metavar="NAME", help="a broker (repeatable)"
    )
    create.add_argument("--cluster", default="", metavar="NAME", help="every master of a cluster")
    create.set_defaults(handler=guarded(_create))

    delete = commands.add_parser("delete", parents=[parent], help="delete a topic everywhere")
    delete.add_argument("topic", metavar="TOPIC")
    delete.set_defaults(handler=guarded(_delete))

    listing = commands.add_parser(
        "list", parents=[parent], help="every topic, sorted, with its message type"
    )
    listing.add_argument(
        "--all",
        action="store_true",
        help="also the system, retry and dead-letter topics (hidden by default)",
    )
    listing.set_defaults(handler=guarded(_list))

    route = commands.add_parser(
        "route", parents=[parent], help="a topic's queues per broker and the brokers' addresses"
    )
    route.add_argument("topic", metavar="TOPIC")
    route.set_defaults(handler=guarded(_route))


def _create(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        brokers = admin.create_topic(
            args.topic,
            read_queue_nums=args.read_queues or args.queues,
            write_queue_nums=args.write_queues or args.queues,
            perm=PERMS[args.perm],
            order=args.order,
            message_type=args.message_type,
            broker_names=args.broker,
            cluster_name=args.cluster,
        )
    if args.json:
        print(dumps({"topic": args.topic, "broker_names": brokers}))
    else:
        print(f"created topic {args.topic} on {', '.join(brokers) or 'no broker'}")
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        existed = admin.delete_topic(args.topic)
    if args.json:
        print(dumps({"topic": args.topic, "existed": existed}))
    elif existed:
        print(f"deleted topic {args.topic}")
    else:
        print(f"topic {args.topic} did not exist on any broker")
    return EXIT_OK if existed else EXIT_FAILURE


def _list(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        types = admin.topic_types(include_hidden=args.all)
    if args.json:
        print(dumps({"topics": list(types), "message_types": types}))
    else:
        print(table(["TOPIC", "TYPE"], [[t, kind] for t, kind in types.items()]))
    return EXIT_OK


def route_json(route: nameserver_pb2.TopicRoute) -> dict[str, Any]:
    return {
        "topic": route.topic,
        "order": route.order,
        "message_type": route.message_type or "NORMAL",
        "queue_datas": [
            {
                "broker_name": q.broker_name,
                "read_queue_nums": q.read_queue_nums,
                "write_queue_nums": q.write_queue_nums,
                "perm": q.perm,
                "topic_sys_flag": q.topic_sys_flag,
                "message_type": q.message_type or "NORMAL",
            }
            for q in sorted(route.queue_datas, key=lambda q: q.broker_name)
        ],
        "broker_datas": [
            {
                "cluster_name": b.cluster_name,
                "broker_name": b.broker_name,
                "addresses": {
                    str(broker_id): {"storage": a.storage, "dispatch": a.dispatch}
                    for broker_id, a in sorted(b.addresses.items())
                },
            }
            for b in sorted(route.broker_datas, key=lambda b: b.broker_name)
        ],
    }


def route_rows(route: nameserver_pb2.TopicRoute) -> list[list[str | int | None]]:
    brokers = {b.broker_name: b for b in route.broker_datas}
    rows: list[list[str | int | None]] = []
    for data in sorted(route.queue_datas, key=lambda q: q.broker_name):
        broker = brokers.get(data.broker_name)
        master = broker.addresses.get(0) if broker is not None else None
        rows.append(
            [
                data.broker_name,
                broker.cluster_name if broker is not None else None,
                data.read_queue_nums,
                data.write_queue_nums,
                _perm_text(data.perm),
                data.message_type or "NORMAL",
                master.storage if master is not None else None,
                master.dispatch if master is not None else None,
                len(broker.addresses) - (master is not None) if broker is not None else 0,
            ]
        )
    return rows


def _perm_text(perm: int) -> str:
    return ("r" if perm & 4 else "-") + ("w" if perm & 2 else "-")


def _route(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        route = admin.route(args.topic)
    if args.json:
        print(dumps(route_json(route)))
        return EXIT_OK
    headers = [
        "BROKER",
        "CLUSTER",
        "READ",
        "WRITE",
        "PERM",
        "TYPE",
        "MASTER",
        "DISPATCH",
        "SLAVES",
    ]
    print(table(headers, route_rows(route)))
    return EXIT_OK
