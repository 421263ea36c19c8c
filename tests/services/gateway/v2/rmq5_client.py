"""Programs of the official RocketMQ 5 Python client (rocketmq-python-client 5.1.2), run
by the v2 tests as subprocesses with .venv-rmq5's Python (the client's generated protobuf
code cannot share a process with Tide's). Each prints one JSON object per line (what it
sent, received or resolved) and exits 0 when it did what it was asked.

    produce ENDPOINT TOPIC --mode normal|fifo|delay --count N
    transaction ENDPOINT TOPIC   (commit one, roll one back, leave one to the check)
    simple ENDPOINT TOPIC GROUP --count N [--invisible-s S] [--change-s S] [--no-ack]
    push ENDPOINT TOPIC GROUP --count N [--fail]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Any

from rocketmq import (  # type: ignore[import-not-found]
    ClientConfiguration,
    ConsumeResult,
    Credentials,
    FilterExpression,
    Message,
    MessageListener,
    Producer,
    PushConsumer,
    SimpleConsumer,
    TransactionChecker,
    TransactionResolution,
)

DEADLINE_S = 120.0  # every program gives up (exit 1) past this
RETRY_S = 0.5  # between calls that failed
SETTLE_S = 10  # past a failed ack's invisible time: no redelivery means it was taken
DELAY_S = 3  # the client's delivery_timestamp is in seconds


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def config(endpoint: str) -> Any:
    # A gateway with --auth-enabled: the user's keys (tests/auth), else none.
    credentials = Credentials(
        os.environ.get("RMQ5_ACCESS_KEY", ""), os.environ.get("RMQ5_SECRET_KEY", "")
    )
    return ClientConfiguration(endpoint, credentials, request_timeout=10)


def described(message: Any) -> dict[str, Any]:
    return {
        "message_id": message.message_id,
        "topic": message.topic,
        "tag": message.tag,
        "keys": sorted(message.keys),
        "properties": dict(message.properties),
        "body": message.body.decode("utf-8", errors="replace"),
        "message_group": message.message_group,
        "delivery_attempt": message.delivery_attempt,
    }


def new_message(topic: str, index: int) -> Any:
    message = Message()
    message.topic = topic
    message.body = f"body-{index}".encode()
    message.tag = "tag-a"
    message.keys = f"key-{index}"
    message.add_property("index", str(index))
    return message


def produce(args: argparse.Namespace) -> None:
    # --tls: the client's own TLS switch; it trusts gRPC's default roots, which the
    # GRPC_DEFAULT_SSL_ROOTS_FILE_PATH environment variable replaces (tests/security).
    producer = Producer(config(args.endpoint), (args.topic,), tls_enable=args.tls)
    producer.startup()
    try:
        produce_all(producer, args)
    except Exception as exc:  # printed for the test (a refused send: tests/auth)
        emit(event="error", call="send", error=str(exc)[:500])
        sys.exit(1)
    finally:
        producer.shutdown()


def produce_all(producer: Any, args: argparse.Namespace) -> None:
    for index in range(args.count):
        message = new_message(args.topic, index)
        if args.mode == "fifo":
            message.message_group = f"group-{index % 2}"
        elif args.mode == "delay":
            message.delivery_timestamp = int(time.time()) + DELAY_S
        receipt = producer.send(message)
        emit(event="sent", index=index, message_id=receipt.message_id)


class Checker(TransactionChecker):  # type: ignore[misc]
    def __init__(self) -> None:
        self.checked = threading.Event()

    def check(self, message: Any) -> Any:
        emit(event="checked", **described(message))
        self.checked.set()
        return TransactionResolution.COMMIT


def transaction(args: argparse.Namespace) -> None:
    checker = Checker()
    producer = Producer(config(args.endpoint), (args.topic,), checker)
    producer.startup()
    try:
        for index, outcome in enumerate(("commit", "rollback", "orphan")):
            txn = producer.begin_transaction()
            receipt = producer.send(new_message(args.topic, index), txn)
            emit(event="half", outcome=outcome, message_id=receipt.message_id)
            if outcome == "commit":
                txn.commit()
            elif outcome == "rollback":
                txn.rollback()
        if not checker.checked.wait(DEADLINE_S):
            emit(event="error", error="no transaction check came")
            sys.exit(1)
        time.sleep(1.0)  # let the checker's EndTransaction go out before shutdown
    finally:
        producer.shutdown()


def simple(args: argparse.Namespace) -> None:
    """Receive until ``count`` distinct messages came and were settled (acked, or left
    with --no-ack). Errors (a gateway or broker restarting) are printed and retried until
    the deadline, as an application would. An ack that failed may still have been taken
    by the server: such a message is waited for (redelivered, acked again) for its
    invisible time and a margin, then taken as acked."""
    consumer = SimpleConsumer(
        config(args.endpoint),
        args.group,
        {args.topic: FilterExpression()},
        await_duration=5,
        tls_enable=args.tls,
    )
    consumer.startup()
    seen: set[str] = set()
    unsure: dict[str, float] = {}  # message id -> when its ack failed
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline and not settled(seen, unsure, args):
            try:
                messages = consumer.receive(16, args.invisible_s)
            except Exception as exc:
                emit(event="error", call="receive", error=str(exc)[:300])
                time.sleep(RETRY_S)
                continue
            for message in messages:
                emit(event="received", **described(message))
                seen.add(message.message_id)
                settle(consumer, message, args, unsure)
    finally:
        consumer.shutdown()
    if not settled(seen, unsure, args):
        sys.exit(1)


def settled(seen: set[str], unsure: dict[str, float], args: argparse.Namespace) -> bool:
    wait_s = args.invisible_s + SETTLE_S
    now = time.monotonic()
    return len(seen) >= args.count and all(now - at > wait_s for at in unsure.values())


def settle(consumer: Any, message: Any, args: argparse.Namespace, unsure: dict[str, float]) -> None:
    try:
        if args.change_s:
            consumer.change_invisible_duration(message, args.change_s)
            emit(event="changed", message_id=message.message_id)
        if args.no_ack:
            return
        consumer.ack(message)
    except Exception as exc:
        emit(event="error", call="ack", message_id=message.message_id, error=str(exc)[:300])
        unsure.setdefault(message.message_id, time.monotonic())
        return
    emit(event="acked", message_id=message.message_id)
    unsure.pop(message.message_id, None)


class Listener(MessageListener):  # type: ignore[misc]
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.seen = 0
        self.lock = threading.Lock()

    def consume(self, message: Any) -> Any:
        emit(event="consumed", **described(message))
        with self.lock:
            self.seen += 1
        return ConsumeResult.FAILURE if self.fail else ConsumeResult.SUCCESS


def push(args: argparse.Namespace) -> None:
    listener = Listener(args.fail)
    consumer = PushConsumer(
        config(args.endpoint), args.group, listener, {args.topic: FilterExpression()}
    )
    consumer.startup()
    deadline = time.monotonic() + DEADLINE_S
    try:
        while listener.seen < args.count and time.monotonic() < deadline:
            time.sleep(0.2)  # the listener runs on the client's own threads
    finally:
        consumer.shutdown()
    if listener.seen < args.count:
        sys.exit(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("produce", "transaction", "simple", "push"):
        sub = commands.add_parser(name)
        sub.add_argument("endpoint")
        sub.add_argument("topic")
        if name in ("simple", "push"):
            sub.add_argument("group")
        sub.add_argument("--count", type=int, default=1)
        sub.add_argument("--mode", default="normal")
        sub.add_argument("--invisible-s", type=int, default=15)
        sub.add_argument("--change-s", type=int, default=0)
        sub.add_argument("--no-ack", action="store_true")
        sub.add_argument("--fail", action="store_true")
        sub.add_argument("--tls", action="store_true", help="produce/simple: tls_enable=True")
    args = parser.parse_args()
    {"produce": produce, "transaction": transaction, "simple": simple, "push": push}[args.command](
        args
    )


if __name__ == "__main__":
    main()
