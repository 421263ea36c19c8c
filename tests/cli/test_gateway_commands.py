"""The gateway commands (topic, cluster, produce, consume, query, offsets) through the real
entry point, in subprocesses (one in-process: a signal at an exact point), against a real
cluster of two brokers."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._cluster import Cluster, cluster_fixture
from tests.services.dispatch.delivery._timed import timed
from tide.cli import _consume, main
from tide.client import Admin, PullConsumer
from tide.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120

cluster = cluster_fixture(brokers=2)


def tide(cluster: Cluster, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tide.cli", *map(str, args), "--gateway", cluster.gateway.listen],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_topic_create_list_route_delete(cluster: Cluster) -> None:
    out = ok(tide(cluster, "topic", "create", "T_cli_topic", "--queues", "3"))
    assert out == "created topic T_cli_topic on broker-a, broker-b\n"
    created = json.loads(
        ok(tide(cluster, "topic", "create", "T_cli_one", "--broker", "broker-b", "--json"))
    )
    assert created == {"topic": "T_cli_one", "broker_names": ["broker-b"]}

    ok(tide(cluster, "topic", "create", "T_cli_fifo", "--message-type", "fifo"))

    listing = [line.split() for line in ok(tide(cluster, "topic", "list")).splitlines()]
    assert listing[0] == ["TOPIC", "TYPE"]
    expected = [["T_cli_fifo", "FIFO"], ["T_cli_one", "NORMAL"], ["T_cli_topic", "NORMAL"]]
    assert all(row in listing for row in expected)
    # The system topics every storage holds are hidden unless asked for.
    assert not any(row[0] == "SCHEDULE_TOPIC_XXXX" for row in listing)
    every = [line.split()[0] for line in ok(tide(cluster, "topic", "list", "--all")).splitlines()]
    assert {"SCHEDULE_TOPIC_XXXX", "rmq_sys_wheel_timer", "T_cli_one"} <= set(every)
    document = json.loads(ok(tide(cluster, "topic", "list", "--json")))
    assert {"T_cli_topic", "T_cli_one"} <= set(document["topics"])
    assert document["message_types"]["T_cli_fifo"] == "FIFO"

    route = ok(tide(cluster, "topic", "route", "T_cli_topic")).splitlines()
    assert route[0].split() == [
        "BROKER", "CLUSTER", "READ", "WRITE", "PERM", "TYPE", "MASTER", "DISPATCH", "SLAVES",
    ]  # fmt: skip
    broker_a = cluster.broker("broker-a")
    assert route[1].split() == [
        "broker-a", "TestCluster", "3", "3", "rw", "NORMAL",
        broker_a.storage_address, broker_a.dispatch_address, "0",
    ]  # fmt: skip
    fifo = json.loads(ok(tide(cluster, "topic", "route", "T_cli_fifo", "--json")))
    assert fifo["message_type"] == "FIFO"
    assert {q["message_type"] for q in fifo["queue_datas"]} == {"FIFO"}
    bad = tide(cluster, "topic", "create", "T_cli_bad", "--message-type", "LIFO")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
    assert route[2].split()[0] == "broker-b"
    document = json.loads(ok(tide(cluster, "topic", "route", "T_cli_topic", "--json")))
    assert [q["broker_name"] for q in document["queue_datas"]] == ["broker-a", "broker-b"]
    assert document["queue_datas"][0]["read_queue_nums"] == 3
    assert document["broker_datas"][0]["addresses"]["0"]["storage"] == broker_a.storage_address

    assert ok(tide(cluster, "topic", "delete", "T_cli_one")) == "deleted topic T_cli_one\n"
    missing = tide(cluster, "topic", "route", "T_cli_one")
    assert missing.returncode == 1
    assert "T_cli_one" in missing.stderr
    assert "NOT_FOUND" in missing.stderr


def test_cluster(cluster: Cluster) -> None:
    rows = ok(tide(cluster, "cluster")).splitlines()
    assert rows[0].split()[:6] == ["CLUSTER", "BROKER", "ID", "ROLE", "STORAGE", "DISPATCH"]
    assert [row.split()[:4] for row in rows[1:]] == [
        ["TestCluster", "broker-a", "0", "master"],
        ["TestCluster", "broker-b", "0", "master"],
    ]
    document = json.loads(ok(tide(cluster, "cluster", "--json")))
    assert document["clusters"] == {"TestCluster": ["broker-a", "broker-b"]}
    assert [b["storage"] for b in document["brokers"]] == [
        b.storage_address for b in cluster.brokers
    ]


def produce_json(cluster: Cluster, topic: str, *args: str) -> list[dict[str, Any]]:
    return json_lines(ok(tide(cluster, "produce", topic, "--json", *args)))


def test_produce(cluster: Cluster) -> None:
    topic = "T_cli_produce"
    cluster.create_topic(topic, queues=2)
    # a summary table per queue
    summary = ok(tide(cluster, "produce", topic, "--count", "6", "--keys", "k{i}", "--batch", "4"))
    lines = summary.splitlines()
    assert lines[0].split() == ["BROKER", "QUEUE", "SENT", "FIRST", "OFFSET", "LAST", "OFFSET"]
    assert sum(int(line.split()[2]) for line in lines[1:-1]) == 6
    assert lines[-1].startswith("sent 6 messages in ")
    # or one JSON line per message
    produced = produce_json(
        cluster, topic, "--count", "6", "--keys", "j{i}", "--tags", "TagJ", "--size", "100",
        "--rate", "1000", "--property", "p=v",
    )  # fmt: skip
    assert [p["index"] for p in produced] == list(range(6))
    assert {p["status"] for p in produced} == {"SEND_OK"}
    assert {p["broker_name"] for p in produced} == {"broker-a", "broker-b"}
    with Admin(cluster.gateway.listen) as admin:
        stored = admin.query_id(produced[3]["msg_id"])
    assert stored.body == b"message 3" + b"." * 91
    assert (stored.keys, stored.tags, stored.properties["p"]) == (("j3",), "TagJ", "v")


def test_produce_later(cluster: Cluster) -> None:
    """--delay-level stores the messages in SCHEDULE_TOPIC_XXXX; delivered 1 s later (level
    1 of the default table) to the real topic; bad input exits 2 naming the accepted forms."""
    topic = "T_cli_later"
    cluster.create_topic(topic, queues=1, message_type="DELAY")
    (produced,) = produce_json(cluster, topic, "--delay-level", "1", "--keys", "later")
    with Admin(cluster.gateway.listen) as admin:
        assert admin.query_id(produced["msg_id"]).topic == "SCHEDULE_TOPIC_XXXX"
        wait_until(
            lambda: admin.query_unique_key(topic, produced["unique_key"]),
            "the delivered copy",
        )
        (copy,) = admin.query_key(topic, "later")
    assert copy.body == b"message 0"
    bad = tide(cluster, "produce", topic, "--deliver-at", "noon")
    assert bad.returncode == 2 and "ISO-8601" in bad.stderr


def test_consume_and_offsets(cluster: Cluster, tmp_path: Path) -> None:
    topic, group = "T_cli_consume", "G_cli_consume"
    cluster.create_topic(topic, queues=2)
    produce_json(cluster, topic, "--count", "12", "--keys", "k{i}")
    # every message once, as JSON lines, with the group's offsets committed
    consumed = json_lines(
        ok(tide(cluster, "consume", group, topic, "--from", "first", "--count", "12", "--json"))
    )
    assert sorted(m["keys"][0] for m in consumed) == sorted(f"k{i}" for i in range(12))
    assert consumed[0]["body_utf8"].startswith("message ")
    offsets = json.loads(ok(tide(cluster, "offsets", topic, "--group", group, "--json")))
    assert offsets["total_lag"] == 0
    assert len(offsets["queues"]) == 4
    for queue in offsets["queues"]:
        assert queue["group_offset"] == queue["max_offset"] == 3
        assert queue["lag"] == 0
    table = ok(tide(cluster, "offsets", topic, "--group", group)).splitlines()
    assert table[0].split() == ["BROKER", "QUEUE", "MIN", "MAX", "GROUP", "OFFSET", "LAG"]
    assert table[1].split() == ["broker-a", "0", "0", "3", "3", "0"]
    assert table[-1].split() == ["total", "-", "-", "-", "-", "0"]
    plain = ok(tide(cluster, "offsets", topic)).splitlines()
    assert plain[0].split() == ["BROKER", "QUEUE", "MIN", "MAX"]
    assert len(plain) == 5

    # lag shows up, and the group continues from its committed offsets (table output)
    produce_json(cluster, topic, "--count", "2", "--keys", "late{i}", "--body", "late")
    lagging = json.loads(ok(tide(cluster, "offsets", topic, "--group", group, "--json")))
    assert lagging["total_lag"] == 2
    follow = ok(tide(cluster, "consume", group, topic, "--count", "2")).splitlines()
    assert follow[0].split()[:4] == ["BROKER", "QUEUE", "OFFSET", "MSG"]
    assert sorted(row.split()[-2] for row in follow[1:]) == ["late0", "late1"]

    # --output writes JSON lines to a file; another group starts where --from says
    target = tmp_path / "out.jsonl"
    result = tide(
        cluster, "consume", "G_cli_other", topic, "--from", "offset", "2", "--count", "6",
        "--output", target,
    )  # fmt: skip
    assert ok(result) == ""
    assert "consumed 6 messages" in result.stderr
    assert sorted(m["queue_offset"] for m in json_lines(target.read_text())) == [2, 2, 2, 2, 3, 3]


def test_query(cluster: Cluster) -> None:
    topic = "T_cli_query"
    cluster.create_topic(topic, queues=2)
    produced = produce_json(cluster, topic, "--count", "4", "--keys", "q{i}")
    msg_id, unique = produced[3]["msg_id"], produced[3]["unique_key"]
    detail = ok(tide(cluster, "query", "id", msg_id)).splitlines()
    assert detail[0].split() == ["FIELD", "VALUE"]
    assert f"msg id           {msg_id}" in detail
    assert "keys             q3" in detail
    assert json.loads(ok(tide(cluster, "query", "id", msg_id, "--json")))["keys"] == ["q3"]

    with Admin(cluster.gateway.listen) as admin:
        wait_until(lambda: len(admin.query_key(topic, "q3")) == 1, "q3 indexed")
    by_key = json.loads(ok(tide(cluster, "query", "key", topic, "q3", "--json")))["messages"]
    assert [m["msg_id"] for m in by_key] == [msg_id]
    rows = ok(tide(cluster, "query", "key", topic, "q3")).splitlines()
    assert rows[0].split()[:4] == ["BROKER", "QUEUE", "OFFSET", "MSG"]
    assert len(rows) == 2
    assert msg_id in rows[1]
    by_uniq = json.loads(ok(tide(cluster, "query", "uniq", topic, unique, "--json")))
    assert [m["msg_id"] for m in by_uniq["messages"]] == [msg_id]
    none = tide(cluster, "query", "key", topic, "nothing-has-this-key")
    assert none.returncode == 1
    assert "no message" in none.stderr


def test_consume_commits_what_it_printed(cluster: Cluster) -> None:
    topic, group = "T_cli_partial", "G_cli_partial"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    ok(tide(cluster, "produce", topic, "--count", "5", "--batch", "5"))
    ok(tide(cluster, "consume", group, topic, "--from", "first", "--count", "2"))
    with PullConsumer(group, cluster.gateway.listen) as consumer:
        [queue] = consumer.queues(topic)
        assert consumer.committed(queue) == 2
    rest = json_lines(ok(tide(cluster, "consume", group, topic, "--count", "3", "--json")))
    assert [m["queue_offset"] for m in rest] == [2, 3, 4]


def test_errors_are_one_line_with_exit_1(cluster: Cluster) -> None:
    missing = tide(cluster, "produce", "T_cli_missing")
    assert missing.returncode == 1
    assert "T_cli_missing" in missing.stderr
    assert "Traceback" not in missing.stderr
    unreachable = subprocess.run(
        [sys.executable, "-m", "tide.cli", "topic", "list", "--gateway", "127.0.0.1:1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert unreachable.returncode == 1
    assert "is a gateway running at 127.0.0.1:1?" in unreachable.stderr


def test_consume_follows_until_ctrl_c(cluster: Cluster) -> None:
    topic, group = "T_cli_follow", "G_cli_follow"
    cluster.create_topic(topic, queues=1, brokers=["broker-b"])
    command = [sys.executable, "-m", "tide.cli", "consume", group, topic, "--json"]
    command += ["--gateway", cluster.gateway.listen, "--from", "first"]
    with subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as follower:
        assert follower.stdout is not None
        ok(tide(cluster, "produce", topic, "--count", "3"))
        lines = [json.loads(follower.stdout.readline()) for _ in range(3)]
        assert [m["queue_offset"] for m in lines] == [0, 1, 2]
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=TIMEOUT_S)
    assert follower.returncode == 130
    assert "interrupted" in err
    with PullConsumer(group, cluster.gateway.listen) as consumer:
        [queue] = consumer.queues(topic)
        assert consumer.committed(queue) == 3


def test_ctrl_c_right_after_printing_commits_what_was_printed(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGINT in the narrowest window: the lines are out, the queue's position not yet
    recorded (where test_consume_follows_until_ctrl_c's SIGINT landed when it found
    offset 0 committed). In-process, so that the signal lands exactly there."""
    topic, group = "T_cli_ctrl_c", "G_cli_ctrl_c"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    ok(tide(cluster, "produce", topic, "--count", "3"))
    print_lines = _consume._print_result

    def print_then_interrupt(printer: Any, result: Any, limit: int | None) -> int:
        printed: int = print_lines(printer, result, limit)
        signal.raise_signal(signal.SIGINT)  # its handler runs before this returns
        return printed

    monkeypatch.setattr(_consume, "_print_result", print_then_interrupt)
    argv = ["consume", group, topic, "--json", "--from", "first"]
    code = main([*argv, "--gateway", cluster.gateway.listen])
    out, err = capsys.readouterr()
    assert [json.loads(line)["queue_offset"] for line in out.splitlines()] == [0, 1, 2]
    assert code == 130, err
    assert "interrupted" in err
    with PullConsumer(group, cluster.gateway.listen) as consumer:
        [queue] = consumer.queues(topic)
        assert consumer.committed(queue) == 3


def test_consume_into_a_closed_pipe_stops_quietly(cluster: Cluster) -> None:
    """``tide consume ... | head -1``: the reader goes away; exit 141, no traceback."""
    topic, group = "T_cli_pipe", "G_cli_pipe"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    ok(tide(cluster, "produce", topic, "--count", "2000", "--batch", "500", "--size", "512"))
    command = [sys.executable, "-m", "tide.cli", "consume", group, topic, "--json"]
    command += ["--gateway", cluster.gateway.listen, "--from", "first", "--count", "2000"]
    with subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as follower:
        assert follower.stdout is not None and follower.stderr is not None
        first = json.loads(follower.stdout.readline())
        follower.stdout.close()  # like `head -1` exiting
        err = follower.stderr.read()
        follower.wait(timeout=TIMEOUT_S)
    assert first["queue_offset"] == 0
    assert follower.returncode == 141, err
    assert "Traceback" not in err, err


def test_recall_a_timed_message(cluster: Cluster) -> None:
    """``tide recall MSG_ID``: a timed message (appended to broker-a's timer topic as the
    gateway's rewrite stores it) is recalled; a message that is not timed is refused."""
    at = time.time_ns() // 1_000_000 + 600_000
    (stored,) = cluster.broker("broker-a").storage.append([timed("T_cli_recall", at, "u1")])
    assert json.loads(ok(tide(cluster, "recall", stored.msg_id, "--json"))) == {
        "unique_key": "u1",
        "deliver_at_ms": at,
    }
    cluster.create_topic("T_cli_recall_n", queues=1)
    (sent,) = produce_json(cluster, "T_cli_recall_n", "--count", "1")
    refused = tide(cluster, "recall", sent["msg_id"])
    assert refused.returncode == 1
    assert "is not a timed message" in refused.stderr, refused.stderr
