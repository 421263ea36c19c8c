"""Every RPC of apache.rocketmq.v2.MessagingService called grpcurl-style, through server
reflection only (reflection_calls.py in a process without our stubs), with bad input
for each (missing fields, unknown topics and groups, out-of-range invisible durations,
a body over 4 MiB, ...) answered in-band with RocketMQ's code, and the good paths that
need no POP (routes, send, pull, offsets, telemetry) answered OK."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests._cluster import Cluster

PROGRAM = Path(__file__).with_name("reflection_calls.py")
GROUP = "V2_reflection_group"
FOUR_MIB_PLUS_BYTES = 4 * 1024 * 1024 + 1


def _calls(cluster: Cluster, calls: list[tuple[str, Any, str]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(PROGRAM), cluster.gateway.listen],
        input=json.dumps(calls),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert "apache.rocketmq.v2.MessagingService" in lines[0]["services"]
    answers = lines[1:]
    assert [a["method"] for a in answers] == [c[0] for c in calls]
    return answers


def _code(answer: dict[str, Any]) -> str:
    assert "error" not in answer, f"{answer['method']} failed with a gRPC error: {answer}"
    reply = answer["reply"]
    first = reply[0] if isinstance(reply, list) else reply
    return str(first["status"]["code"])


def _queue(topic: str, queue_id: int = 0, broker: str = "broker-a") -> dict[str, Any]:
    return {"topic": {"name": topic}, "id": queue_id, "broker": {"name": broker}}


def _message(topic: str, body: bytes = b"hello", message_id: str = "01AB") -> dict[str, Any]:
    return {
        "topic": {"name": topic},
        "body": base64.b64encode(body).decode(),
        "user_properties": {"p": "v"},
        "system_properties": {"message_id": message_id, "tag": "T", "keys": ["k"]},
    }


def _fifo_message(topic: str) -> dict[str, Any]:
    message = _message(topic)
    message["system_properties"].update(message_type="FIFO", message_group="g")
    return message


def test_bad_input_is_answered_in_band_with_the_proxys_codes(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=1)
    unknown = f"{topic_name}_unknown"
    group = {"name": GROUP}
    receive = {"group": group, "message_queue": _queue(topic_name), "batch_size": 1}
    cases: list[tuple[str, Any, str, str]] = [
        ("QueryRoute", {}, "unary", "ILLEGAL_TOPIC"),
        ("QueryRoute", {"topic": {"name": "bad topic!"}}, "unary", "ILLEGAL_TOPIC"),
        ("QueryRoute", {"topic": {"name": unknown}}, "unary", "TOPIC_NOT_FOUND"),
        ("Heartbeat", {"group": {"name": "CID_RMQ_SYS_X"}}, "unary", "ILLEGAL_CONSUMER_GROUP"),
        ("SendMessage", {}, "unary", "MESSAGE_CORRUPTED"),
        (
            "SendMessage",
            {"messages": [_message(topic_name, message_id="")]},
            "unary",
            "ILLEGAL_MESSAGE_ID",
        ),
        ("SendMessage", {"messages": [_message(unknown)]}, "unary", "TOPIC_NOT_FOUND"),
        (
            "SendMessage",
            {"messages": [_fifo_message(topic_name)]},
            "unary",
            "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE",
        ),
        (
            "SendMessage",
            {"messages": [_message(topic_name, b"x" * FOUR_MIB_PLUS_BYTES)]},
            "unary",
            "MESSAGE_BODY_TOO_LARGE",
        ),
        ("QueryAssignment", {"topic": {"name": topic_name}}, "unary", "ILLEGAL_CONSUMER_GROUP"),
        (
            "QueryAssignment",
            {"topic": {"name": unknown}, "group": group},
            "unary",
            "TOPIC_NOT_FOUND",
        ),
        ("ReceiveMessage", {**receive, "group": {}}, "server_stream", "ILLEGAL_CONSUMER_GROUP"),
        (
            "ReceiveMessage",
            {**receive, "invisible_duration": "1s"},
            "server_stream",
            "ILLEGAL_INVISIBLE_TIME",
        ),
        (
            "ReceiveMessage",
            {**receive, "invisible_duration": "50000s"},
            "server_stream",
            "ILLEGAL_INVISIBLE_TIME",
        ),
        (
            "ReceiveMessage",
            {
                **receive,
                "filter_expression": {"type": "SQL", "expression": "a>1"},
                "invisible_duration": "30s",
            },
            "server_stream",
            "ILLEGAL_FILTER_EXPRESSION",
        ),
        (
            "AckMessage",
            {"group": group, "topic": {"name": topic_name}, "entries": [{"message_id": "01AB"}]},
            "unary",
            "INVALID_RECEIPT_HANDLE",
        ),
        ("AckMessage", {"topic": {"name": topic_name}}, "unary", "ILLEGAL_CONSUMER_GROUP"),
        (
            "ChangeInvisibleDuration",
            {
                "group": group,
                "topic": {"name": topic_name},
                "receipt_handle": "h",
                "invisible_duration": "50000s",
            },
            "unary",
            "ILLEGAL_INVISIBLE_TIME",
        ),
        (
            "ForwardMessageToDeadLetterQueue",
            {"group": group, "topic": {"name": topic_name}},
            "unary",
            "INVALID_RECEIPT_HANDLE",
        ),
        (
            "PullMessage",
            {"group": group, "message_queue": {"topic": {"name": topic_name}}, "batch_size": 1},
            "server_stream",
            "BAD_REQUEST",
        ),
        (
            "PullMessage",
            {"group": group, "message_queue": _queue(unknown), "batch_size": 1},
            "server_stream",
            "TOPIC_NOT_FOUND",
        ),
        (
            "UpdateOffset",
            {"group": group, "message_queue": _queue(topic_name), "offset": -1},
            "unary",
            "ILLEGAL_OFFSET",
        ),
        (
            "GetOffset",
            {"group": group, "message_queue": _queue(unknown)},
            "unary",
            "TOPIC_NOT_FOUND",
        ),
        (
            "QueryOffset",
            {"message_queue": _queue(topic_name), "query_offset_policy": "TIMESTAMP"},
            "unary",
            "BAD_REQUEST",
        ),
        (
            "EndTransaction",
            {"topic": {"name": topic_name}, "transaction_id": "nope", "resolution": "COMMIT"},
            "unary",
            "INVALID_TRANSACTION_ID",
        ),
        (
            "EndTransaction",
            {"topic": {"name": topic_name}, "transaction_id": "b.1.AB.x"},
            "unary",
            "BAD_REQUEST",
        ),
        (
            "Telemetry",
            [{"settings": {"client_type": "SIMPLE_CONSUMER", "subscription": {}}}],
            "bidi",
            "ILLEGAL_CONSUMER_GROUP",
        ),
        ("Telemetry", [{"verify_message_command": {"nonce": "n"}}], "bidi", "UNSUPPORTED"),
        (
            "Telemetry",
            [{"print_thread_stack_trace_command": {"nonce": "n"}}],
            "bidi",
            "UNSUPPORTED",
        ),
        ("RecallMessage", {"topic": {"name": topic_name}}, "unary", "BAD_REQUEST"),
        (
            "RecallMessage",
            {"topic": {"name": topic_name}, "recall_handle": "nope"},
            "unary",
            "BAD_REQUEST",
        ),
        ("SyncLiteSubscription", {}, "unary", "UNSUPPORTED"),
    ]
    answers = _calls(cluster, [(m, r, k) for m, r, k, _ in cases])
    got = [(a["method"], _code(a)) for a in answers]
    assert got == [(m, code) for m, _, _, code in cases]
    for answer in answers:  # each says what to fix, bounded
        reply = answer["reply"]
        message = (reply[0] if isinstance(reply, list) else reply)["status"]["message"]
        assert message and len(message) < 1_000, answer


def test_good_calls_through_reflection(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    queue = _queue(topic_name)
    group = {"name": GROUP}
    sent, pulled, end, updated, got, telemetry, others = _calls(
        cluster,
        [
            ("SendMessage", {"messages": [_message(topic_name, message_id="01CAFE")]}, "unary"),
            (
                "PullMessage",
                {
                    "group": group,
                    "message_queue": queue,
                    "batch_size": 8,
                    "long_polling_timeout": "5s",
                },
                "server_stream",
            ),
            ("QueryOffset", {"message_queue": queue, "query_offset_policy": "END"}, "unary"),
            ("UpdateOffset", {"group": group, "message_queue": queue, "offset": 1}, "unary"),
            ("GetOffset", {"group": group, "message_queue": queue}, "unary"),
            (
                "Telemetry",
                [
                    {
                        "settings": {
                            "client_type": "PRODUCER",
                            "publishing": {"topics": [{"name": topic_name}]},
                        }
                    }
                ],
                "bidi",
            ),
            ("NotifyClientTermination", {"group": group}, "unary"),
        ],
    )
    assert sent["reply"]["entries"][0]["message_id"] == "01CAFE"
    stream = pulled["reply"]
    assert stream[0]["status"]["code"] == "OK"
    message = stream[1]["message"]
    assert message["system_properties"]["message_id"] == "01CAFE"
    assert message["system_properties"]["tag"] == "T"
    assert message["system_properties"]["keys"] == ["k"]
    assert message["system_properties"]["body_encoding"] == "IDENTITY"
    assert message["user_properties"] == {"p": "v"}
    assert base64.b64decode(message["body"]) == b"hello"
    assert stream[2]["next_offset"] == "1"  # int64 as JSON text
    assert end["reply"]["offset"] == "1"
    assert _code(updated) == "OK"
    assert got["reply"]["offset"] == "1"
    settings = telemetry["reply"][0]
    assert settings["status"]["code"] == "OK"
    assert settings["settings"]["publishing"]["max_body_size"] > 0
    assert _code(others) == "OK"
