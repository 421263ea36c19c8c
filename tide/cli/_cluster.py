"""``tide cluster``: the brokers the name servers know, and when each last registered."""

from __future__ import annotations

import argparse
import time
from typing import Any

from tide.cli._common import EXIT_OK, client_tls, gateway_parent, guarded
from tide.cli._output import Cell, dumps, table, utc_time
from tide.client import Admin
from tide.v1 import nameserver_pb2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cluster",
        parents=[gateway_parent()],
        help="list clusters and their brokers",
        description="Every broker member the name servers know: cluster, broker name, id "
        "(0 is the master), addresses, topic count and the age of its last registration.",
    )
    parser.set_defaults(handler=guarded(_run))


def cluster_rows(info: nameserver_pb2.ClusterInfo, now_ms: int) -> list[list[Cell]]:
    members = sorted(info.brokers, key=lambda b: (b.cluster_name, b.broker_name, b.broker_id))
    return [
        [
            b.cluster_name,
            b.broker_name,
            b.broker_id,
            "master" if b.broker_id == 0 else "slave",
            b.address.storage,
            b.address.dispatch,
            b.topic_count,
            round(max(0, now_ms - b.last_update_ms) / 1000, 1),
        ]
        for b in members
    ]


def cluster_json(info: nameserver_pb2.ClusterInfo) -> dict[str, Any]:
    return {
        "clusters": {
            name: list(brokers.broker_names) for name, brokers in sorted(info.clusters.items())
        },
        "brokers": [
            {
                "cluster_name": b.cluster_name,
                "broker_name": b.broker_name,
                "broker_id": b.broker_id,
                "storage": b.address.storage,
                "dispatch": b.address.dispatch,
                "topic_count": b.topic_count,
                "last_update_ms": b.last_update_ms,
                "last_update": utc_time(b.last_update_ms),
                "heartbeat_timeout_ms": b.heartbeat_timeout_ms,
            }
            for b in sorted(
                info.brokers, key=lambda b: (b.cluster_name, b.broker_name, b.broker_id)
            )
        ],
    }


def _run(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        info = admin.cluster()
    if args.json:
        print(dumps(cluster_json(info)))
        return EXIT_OK
    headers = ["CLUSTER", "BROKER", "ID", "ROLE", "STORAGE", "DISPATCH", "TOPICS", "AGE (S)"]
    print(table(headers, cluster_rows(info, int(time.time() * 1000))))
    return EXIT_OK
