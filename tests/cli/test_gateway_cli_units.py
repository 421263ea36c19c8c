"""The gateway commands' argument parsing and output formatting (no services)."""

from __future__ import annotations

import argparse
import io

import pytest

from tide.cli import build_parser, main
from tide.cli._common import GATEWAY_ENV
from tide.cli._consume import Start, parse_start, start_position
from tide.cli._offsets import QueueReport, render_table
from tide.cli._output import ProgressBar, body_preview, message_json, table, utc_time
from tide.cli._produce import Summary, build_message, make_body
from tide.client import (
    InvalidArgument,
    MessageQueue,
    ReceivedMessage,
    SendResult,
    SendStatus,
)

T_MS = 1_700_000_000_000
QUEUE = MessageQueue("T", "broker-a", 1)


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_gateway_comes_from_the_flag_the_env_or_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(GATEWAY_ENV, raising=False)
    assert parse("topic", "list").gateway == "127.0.0.1:8081"
    monkeypatch.setenv(GATEWAY_ENV, "10.0.0.1:9000")
    assert parse("topic", "list").gateway == "10.0.0.1:9000"
    assert parse("topic", "list", "--gateway", "h:1").gateway == "h:1"


def test_every_gateway_command_parses() -> None:
    assert (
        parse("topic", "create", "T", "--queues", "8", "--perm", "r", "--broker", "b").queues == 8
    )
    assert parse("topic", "delete", "T").topic == "T"
    assert parse("topic", "route", "T", "--json").json
    assert parse("cluster").command == "cluster"
    args = parse("produce", "T", "--count", "5", "--keys", "k{i}", "--rate", "2.5", "--batch", "3")
    assert (args.count, args.keys, args.rate, args.batch) == (5, ["k{i}"], 2.5, 3)
    args = parse("consume", "G", "T", "--from", "offset", "5", "--count", "2")
    assert (args.group, args.topic, args.start, args.count) == ("G", "T", ["offset", "5"], 2)
    assert parse("query", "id", "ABC").msg_id == "ABC"
    assert parse("query", "key", "T", "k1", "--max", "5").max == 5
    assert parse("offsets", "T", "--group", "G").group == "G"
    assert parse("store", "verify", "/x").command == "store"  # the others still work
    assert parse("up").command == "up"


@pytest.mark.parametrize(
    "argv",
    [
        ["produce", "T", "--count", "0"],
        ["produce", "T", "--batch", "2000"],
        ["produce", "T", "--rate", "-1"],
        ["produce", "T", "--property", "novalue"],
        ["produce", "T", "--delay-level", "0"],
        ["produce", "T", "--delay-level", "2", "--delay", "30s"],
        ["produce", "T", "--delay", "30"],
        ["produce", "T", "--deliver-at", "tomorrow"],
        ["topic", "create", "T", "--perm", "x"],
        ["consume", "G"],
        ["offsets"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "error" in capsys.readouterr().err


def test_consume_from_bad_words_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["consume", "G", "T", "--from", "offset", "x"]) == 2
    assert "give first, last, offset N" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("words", "start"),
    [
        (None, Start("committed")),
        (["first"], Start("first")),
        (["last"], Start("last")),
        (["offset", "7"], Start("offset", 7)),
        (["time", str(T_MS)], Start("time", T_MS)),
        (["time", "2023-11-14T22:13:20Z"], Start("time", T_MS)),
    ],
)
def test_parse_start(words: list[str] | None, start: Start) -> None:
    assert parse_start(words) == start


@pytest.mark.parametrize(
    "words", [["first", "1"], ["offset"], ["offset", "-1"], ["time", "soon"], ["middle"]]
)
def test_parse_start_rejects(words: list[str]) -> None:
    with pytest.raises(InvalidArgument):
        parse_start(words)


def test_start_position() -> None:
    bounds = (2, 10)

    def never(*_: int) -> int:
        raise AssertionError("not expected")

    assert start_position(Start("committed"), lambda: 5, bounds, never) == 5
    assert start_position(Start("committed"), lambda: -1, bounds, never) == 10
    assert start_position(Start("committed"), lambda: 0, bounds, never) == 2
    assert start_position(Start("first"), never, bounds, never) == 2
    assert start_position(Start("last"), never, bounds, never) == 10
    assert start_position(Start("offset", 99), never, bounds, never) == 10
    assert start_position(Start("offset", 4), never, bounds, never) == 4
    assert start_position(Start("time", T_MS), never, bounds, lambda ts: 6) == 6


def test_table_aligns_and_right_aligns_numbers() -> None:
    text = table(["NAME", "N", "MAYBE"], [["a", 1, None], ["long name", 100, 3]])
    assert text.splitlines() == [
        "NAME         N  MAYBE",
        "a            1      -",
        "long name  100      3",
    ]
    assert table(["ONLY"], []) == "ONLY"


def test_small_formatters() -> None:
    assert utc_time(T_MS + 5) == "2023-11-14T22:13:20.005Z"
    assert utc_time(0) == ""
    assert body_preview(b"a\nb") == "a\\nb"
    assert body_preview(b"\xff\xfe") == "<2 bytes>"
    assert body_preview(b"x" * 100, limit=10) == "xxxxxxx..."


def received(body: bytes = b"hi") -> ReceivedMessage:
    return ReceivedMessage(
        queue=QUEUE,
        queue_offset=3,
        body=body,
        tags="A",
        keys=("k",),
        properties={"UNIQ_KEY": "U"},
        msg_id="M",
        unique_key="U",
        born_timestamp_ms=1,
        store_timestamp_ms=2,
        born_host="h:1",
        store_host="h:2",
        reconsume_times=0,
        physical_offset=10,
        size_bytes=100,
    )


def test_message_json() -> None:
    document = message_json(received())
    assert document["body"] == "aGk="
    assert document["body_utf8"] == "hi"
    assert (document["broker_name"], document["queue_id"], document["queue_offset"]) == (
        "broker-a",
        1,
        3,
    )
    assert message_json(received(b"\xff"))["body_utf8"] is None


def test_progress_bar_draws_only_when_enabled() -> None:
    stream = io.StringIO()
    ProgressBar(stream, 10, enabled=False).update(5)
    assert stream.getvalue() == ""
    bar = ProgressBar(stream, 10, enabled=True)
    bar.update(10)
    bar.finish()
    assert "10/10" in stream.getvalue()
    assert bar.render(5, 1.0).startswith("[" + "#" * 15 + "." * 15 + "] 5/10  50.0%")


def test_produce_bodies_and_messages() -> None:
    assert make_body("m {i}", 7, None) == b"m 7"
    assert make_body("m {i}", 7, 5) == b"m 7.."
    assert make_body("message {i}", 7, 3) == b"mes"
    args = parse("produce", "T", "--keys", "k{i}", "--keys", "x", "--tags", "A",
                 "--property", "a=b=c", "--sharding-key", "s{i}")  # fmt: skip
    message = build_message(args, 4)
    assert (message.keys, message.tags, message.sharding_key) == (["k4", "x"], "A", "s4")
    assert message.properties == {"a": "b=c"}
    assert message.body == b"message 4"


def test_produce_delay_options() -> None:
    assert build_message(parse("produce", "T", "--delay-level", "3"), 0).delay_level == 3
    assert build_message(parse("produce", "T", "--delay", "30s"), 0).delay_ms == 30_000
    assert parse("produce", "T", "--delay", "500ms").delay == 500
    assert parse("produce", "T", "--delay", "2h").delay == 7_200_000
    assert parse("produce", "T", "--deliver-at", "1767225600000").deliver_at == 1767225600000
    utc = parse("produce", "T", "--deliver-at", "2026-01-01T00:00:00Z").deliver_at
    assert utc == 1767225600000
    offset = parse("produce", "T", "--deliver-at", "2026-01-01 02:00:00+02:00").deliver_at
    assert offset == 1767225600000
    plain = build_message(parse("produce", "T"), 0)
    assert (plain.delay_level, plain.deliver_at_ms, plain.delay_ms) == (0, 0, 0)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--deliver-at", "tomorrow"], "give milliseconds since the epoch (1767225600000), or"),
        (["--delay", "30"], "give a count and a unit: ms, s, m, h or d"),
        (["--delay-level", "x"], "is not a delay level"),
        (["--delay", "1s", "--deliver-at", "5"], "not allowed with argument"),
    ],
)
def test_produce_delay_errors_name_the_accepted_forms(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["produce", "T", *argv]) == 2
    assert says in capsys.readouterr().err


def test_produce_summary() -> None:
    summary = Summary()
    for offset in (5, 6):
        summary.add(SendResult(SendStatus.SEND_OK, "M", "U", QUEUE, offset, 0))
    summary.add(SendResult(SendStatus.SEND_FAILED, "", "", QUEUE, -1, 0, error="disk full"))
    assert (summary.sent, summary.failed) == (2, 1)
    assert summary.rows() == [["broker-a", 1, 2, 5, 6]]


def test_offsets_table_and_lag() -> None:
    reports = [
        QueueReport(MessageQueue("T", "broker-a", 0), 0, 10, 4),
        QueueReport(MessageQueue("T", "broker-a", 1), 0, 5, -1),
    ]
    assert reports[0].lag == 6
    assert reports[1].lag is None
    assert reports[1].to_json()["group_offset"] is None
    lines = render_table(reports, "G").splitlines()
    assert lines[0].split() == ["BROKER", "QUEUE", "MIN", "MAX", "GROUP", "OFFSET", "LAG"]
    assert lines[1].split() == ["broker-a", "0", "0", "10", "4", "6"]
    assert lines[2].split() == ["broker-a", "1", "0", "5", "-", "-"]
    assert lines[3].split() == ["total", "-", "-", "-", "-", "6"]
    assert "GROUP" not in render_table(reports[:1], None)
