"""``tide group create|update|show|list|delete``: consumer group configs through the
gateway (RocketMQ's mqadmin updateSubGroup / deleteSubGroup): retry policy and maximum,
retry queues, consume enable. docs/delivery.md, "Consumer group configs"."""

from __future__ import annotations

import argparse
import re
from typing import Any

from tide.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    client_tls,
    gateway_parent,
    guarded,
    non_negative_int,
)
from tide.cli._output import dumps, table
from tide.client import Admin, SimpleConsumer
from tide.v1 import storage_pb2

_DURATION = re.compile(r"([0-9]{1,12})(ms|s|m|h|d)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_POLICY_NAMES = {
    storage_pb2.RetryPolicy.CUSTOMIZED: "customized",
    storage_pb2.RetryPolicy.EXPONENTIAL: "exponential",
}


def duration_ms(text: str) -> int:
    """``500ms``, ``10s``, ``5m``, ``2h``, ``1d`` in ms."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a duration; write a count and a unit: ms, s, m, h or d "
            "(for example 10s)"
        )
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def durations_ms(text: str) -> list[int]:
    """``10s,30s,1m``: the durations in ms, in order."""
    return [duration_ms(part) for part in text.split(",")]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parent = gateway_parent()
    group = subparsers.add_parser("group", help="create, update, show, list, delete group configs")
    commands = group.add_subparsers(dest="group_command", metavar="SUBCOMMAND", required=True)
    create = commands.add_parser(
        "create",
        parents=[parent, _config_parent()],
        help="create or replace a group's config (unnamed fields: the defaults)",
        description="Set a consumer group's config on the given brokers, on every master "
        "of --cluster, or (neither given) on every master broker. Fields not given take the "
        "defaults (16 retries, RocketMQ 4's delay levels, 1 retry queue, consume enabled).",
    )
    create.set_defaults(handler=guarded(_create), update=False)
    update = commands.add_parser(
        "update",
        parents=[parent, _config_parent()],
        help="change only the given fields of a group's config",
    )
    update.set_defaults(handler=guarded(_create), update=True)
    show = commands.add_parser("show", parents=[parent], help="a group's config")
    show.add_argument("group", metavar="GROUP")
    show.set_defaults(handler=guarded(_show))
    listing = commands.add_parser("list", parents=[parent], help="every group with a config")
    listing.set_defaults(handler=guarded(_list))
    delete = commands.add_parser(
        "delete", parents=[parent], help="forget a group's config (back to the defaults)"
    )
    delete.add_argument("group", metavar="GROUP")
    delete.set_defaults(handler=guarded(_delete))
    locks = commands.add_parser(
        "locks",
        parents=[parent],
        help="the queue locks orderly consumers of a group hold on a topic",
        description='Each unexpired queue lock (docs/client.md, "Ordering"): the queue, '
        "the member holding it and how long its lease has left unless renewed.",
    )
    locks.add_argument("group", metavar="GROUP")
    locks.add_argument("topic", metavar="TOPIC")
    locks.set_defaults(handler=guarded(_locks))
    lag = commands.add_parser(
        "lag",
        parents=[parent],
        help="a group's lag on a topic: ready, in flight, delayed (POP and pull groups)",
        description="Per queue of TOPIC on every master: the group's consumer offset (a POP "
        "group's next offset, a pull group's committed one), ready (stored, not yet "
        "consumed), in flight (received by POP, not acked) and, in total, delayed (waiting "
        'in the group\'s POP retry topic to be delivered again). docs/pop.md, "Lag".',
    )
    lag.add_argument("group", metavar="GROUP")
    lag.add_argument("topic", metavar="TOPIC")
    lag.set_defaults(handler=guarded(_lag))


def _config_parent() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("group", metavar="GROUP")
    parser.add_argument(
        "--retry-max-times",
        type=int,
        metavar="N",
        help="deliveries before the dead-letter queue, 0..1000 (-1: the default 16)",
    )
    parser.add_argument(
        "--retry-policy",
        choices=sorted(_POLICY_NAMES.values()),
        help="customized: a list of delays (default: the delay levels); exponential: "
        "initial * multiplier ** attempt, at most max",
    )
    parser.add_argument(
        "--retry-delays",
        type=durations_ms,
        metavar="LIST",
        help="customized delays, e.g. 10s,30s,1m,2m (attempt r waits the (r + 3)rd, the "
        "last one from there on)",
    )
    parser.add_argument("--retry-initial", type=duration_ms, metavar="DURATION")
    parser.add_argument("--retry-max", type=duration_ms, metavar="DURATION")
    parser.add_argument("--retry-multiplier", type=int, metavar="N")
    parser.add_argument(
        "--retry-queue-nums", type=non_negative_int, metavar="N", help="queues of %%RETRY%%GROUP"
    )
    parser.add_argument(
        "--consume-enable",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the group may consume (--no-consume-enable stops it)",
    )
    parser.add_argument(
        "--consume-orderly",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the group consumes FIFO topics in order (POP: one message group in "
        "flight at a time; docs/pop.md)",
    )
    parser.add_argument(
        "--broker", action="append", default=[], metavar="NAME", help="a broker (repeatable)"
    )
    parser.add_argument("--cluster", default="", metavar="NAME", help="every master of a cluster")
    return parser


def _create(args: argparse.Namespace) -> int:
    fields = {
        "retry_max_times": args.retry_max_times,
        "retry_policy": args.retry_policy,
        "retry_delays_ms": args.retry_delays,
        "retry_initial_ms": args.retry_initial,
        "retry_max_ms": args.retry_max,
        "retry_multiplier": args.retry_multiplier,
        "retry_queue_nums": args.retry_queue_nums,
        "consume_enable": args.consume_enable,
        "consume_orderly": args.consume_orderly,
    }
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        change = admin.update_group if args.update else admin.create_group
        brokers = change(args.group, broker_names=args.broker, cluster_name=args.cluster, **fields)
        answer = admin.get_group(args.group)
    if args.json:
        print(dumps({"group": group_json(answer.group), "broker_names": brokers}))
    else:
        verb = "updated" if args.update else "created"
        print(f"{verb} group {args.group} on {', '.join(brokers) or 'no broker'}")
        print(table(["FIELD", "VALUE"], group_rows(answer.group)))
    return EXIT_OK


def _show(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        answer = admin.get_group(args.group)
    if args.json:
        print(dumps({"found": answer.found, "group": group_json(answer.group)}))
    else:
        if not answer.found:
            print(f"group {args.group} has no config: the defaults")
        print(table(["FIELD", "VALUE"], group_rows(answer.group)))
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        groups = admin.list_groups()
    if args.json:
        print(dumps({"groups": [group_json(g) for g in groups]}))
        return EXIT_OK
    headers = ["GROUP", "CONSUME", "RETRY MAX", "POLICY", "RETRY QUEUES"]
    rows: list[list[str | int | None]] = [
        [
            g.group_name,
            "on" if g.consume_enable else "off",
            g.retry_max_times,
            policy_text(g.retry_policy),
            g.retry_queue_nums,
        ]
        for g in groups
    ]
    print(table(headers, rows))
    return EXIT_OK


def _delete(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        existed = admin.delete_group(args.group)
    if args.json:
        print(dumps({"group": args.group, "existed": existed}))
    elif existed:
        print(f"deleted the config of group {args.group}")
    else:
        print(f"group {args.group} had no config on any broker")
    return EXIT_OK if existed else EXIT_FAILURE


def group_json(group: storage_pb2.GroupConfig) -> dict[str, Any]:
    policy = group.retry_policy
    policy_doc: dict[str, Any] = {"type": _POLICY_NAMES.get(policy.type, str(policy.type))}
    if policy.type == storage_pb2.RetryPolicy.EXPONENTIAL:
        policy_doc.update(
            initial_ms=policy.initial_ms, max_ms=policy.max_ms, multiplier=policy.multiplier
        )
    else:
        policy_doc["delays_ms"] = list(policy.delays_ms)
    return {
        "group_name": group.group_name,
        "consume_enable": group.consume_enable,
        "retry_max_times": group.retry_max_times,
        "retry_queue_nums": group.retry_queue_nums,
        "retry_policy": policy_doc,
        "consume_message_orderly": group.consume_message_orderly,
        "consume_broadcast_enable": group.consume_broadcast_enable,
        "consume_timeout_minute": group.consume_timeout_minute,
    }


def group_rows(group: storage_pb2.GroupConfig) -> list[list[str | int | None]]:
    return [
        ["group", group.group_name],
        ["consume enable", "on" if group.consume_enable else "off"],
        ["retry max times", group.retry_max_times],
        ["retry policy", policy_text(group.retry_policy)],
        ["retry queue nums", group.retry_queue_nums],
        ["consume orderly", "on" if group.consume_message_orderly else "off"],
        ["consume timeout (min)", group.consume_timeout_minute],
    ]


def policy_text(policy: storage_pb2.RetryPolicy) -> str:
    if policy.type == storage_pb2.RetryPolicy.EXPONENTIAL:
        return (
            f"exponential {_text(policy.initial_ms)} x{policy.multiplier} "
            f"up to {_text(policy.max_ms)}"
        )
    if not policy.delays_ms:
        return "customized (the delay levels: 10s, 30s, 1m, ... 2h)"
    return "customized " + ",".join(_text(ms) for ms in policy.delays_ms)


def _text(ms: int) -> str:
    for unit in ("d", "h", "m", "s"):
        if ms and ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


def _locks(args: argparse.Namespace) -> int:
    with Admin(args.gateway, tls=client_tls(args)) as admin:
        answer = admin.queue_locks(args.group, args.topic)
    rows: list[list[str | int]] = [
        [lock.broker_name, lock.queue_id, lock.client_id, lock.expires_in_ms]
        for lock in answer.locks
    ]
    if args.json:
        keys = ("broker_name", "queue_id", "client_id", "expires_in_ms")
        print(
            dumps(
                {
                    "locks": [dict(zip(keys, row, strict=True)) for row in rows],
                    "in_grace": answer.in_grace,
                }
            )
        )
        return EXIT_OK
    if answer.in_grace:
        print("a broker started less than one lease ago: it grants no lock yet")
    if not rows:
        print(f"no queue of {args.topic} is locked by group {args.group}")
        return EXIT_OK
    print(table(["BROKER", "QUEUE", "CLIENT ID", "EXPIRES IN MS"], rows))
    return EXIT_OK


def _lag(args: argparse.Namespace) -> int:
    with SimpleConsumer(
        args.group, args.topic, gateway=args.gateway, tls=client_tls(args)
    ) as consumer:
        lag = consumer.lag()
    if args.json:
        print(
            dumps(
                {
                    "group": args.group,
                    "topic": args.topic,
                    "ready": lag.ready,
                    "inflight": lag.inflight,
                    "delayed": lag.delayed,
                    "queues": [
                        {
                            "broker_name": q.broker_name,
                            "queue_id": q.queue_id,
                            "max_offset": q.max_offset,
                            "consumer_offset": q.consumer_offset
                            if q.consumer_offset >= 0
                            else None,
                            "ready": q.ready,
                            "inflight": q.inflight,
                        }
                        for q in lag.queues
                    ],
                }
            )
        )
        return EXIT_OK
    rows: list[list[str | int | None]] = [
        [
            q.broker_name,
            q.queue_id,
            q.max_offset,
            _offset(q.consumer_offset),
            q.ready,
            q.inflight,
        ]
        for q in lag.queues
    ]
    rows.append(["total", None, None, None, lag.ready, lag.inflight])
    print(table(["BROKER", "QUEUE", "MAX", "GROUP OFFSET", "READY", "INFLIGHT"], rows))
    print(f"delayed (waiting to be delivered again): {lag.delayed}")
    return EXIT_OK


def _offset(offset: int) -> int | None:
    return offset if offset >= 0 else None  # -1: the group has none for the queue
