"""The messages page's data against a real one-broker cluster: search by id, key, unique
key and time range; body previews; the commitlog position; a message's trace."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from services.console.data import limits
from services.console.data.bodies import preview
from services.console.data.messages import (
    SearchResult,
    by_id,
    by_key,
    by_time,
    by_unique_key,
)
from services.console.data.trace import (
    DeliveryState,
    check_trace_url_template,
    trace,
    trace_id,
)
from tests._cluster import Cluster
from tide.client import Admin, InvalidArgument, MessageQueue, NotFound, Producer, PullConsumer
from tide.waiting import wait_until


@pytest.fixture(scope="module")
def cluster(console_cluster: Cluster) -> Cluster:
    """The console tests' one cluster (tests/services/console/conftest.py)."""
    return console_cluster


WAIT_S = 30.0
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Iterator[Admin]:
    with Admin(cluster.gateway.listen) as client:
        yield client


def test_preview_text_json_and_hex() -> None:
    shown = preview(b'{"order": 7, "items": ["a"]}')
    assert shown.text == '{"order": 7, "items": ["a"]}' and not shown.replaced
    assert shown.json is not None and json.loads(shown.json) == {"order": 7, "items": ["a"]}
    assert shown.json.startswith('{\n  "order": 7')
    assert shown.hex.startswith("00000000  7b 22 6f 72")
    assert preview(b"plain words").json is None
    assert preview(b"[1, 2").json is None  # does not parse

    binary = preview(b"ab\xff\xfe" + bytes(range(40)))
    assert binary.replaced and "\ufffd" in binary.text and binary.json is None
    assert binary.hex.splitlines()[0].endswith("ab..............")

    large = preview("é".encode() * limits.PREVIEW_TEXT_MAX_BYTES)
    assert large.text_truncated and large.json is None and not large.replaced
    assert len(large.text) == limits.PREVIEW_TEXT_MAX_BYTES // 2  # no half character
    assert large.hex_truncated
    assert len(large.hex.splitlines()) == limits.PREVIEW_HEX_MAX_BYTES // 16


def test_trace_ids_and_the_url_template() -> None:
    assert trace_id(TRACEPARENT) == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert trace_id("00-" + "0" * 32 + "-00f067aa0ba902b7-01") == ""
    assert trace_id("garbage") == ""
    check_trace_url_template("http://jaeger:16686/trace/{trace_id}")
    with pytest.raises(ValueError, match="has no"):
        check_trace_url_template("http://jaeger:16686/trace/")


def test_search_by_id_key_unique_key_and_time(cluster: Cluster, admin: Admin) -> None:
    topic = "T_console_search"
    cluster.create_topic(topic, queues=2)
    with Producer(cluster.gateway.listen) as producer:
        sent = [
            producer.send(topic, json.dumps({"n": i}), tags="TagA", keys=[f"order-{i}"])
            for i in range(6)
        ]
        other = producer.send(topic, b"\x00\x01binary", keys=["order-1"], properties={"p": "v"})

    found = by_id(admin, sent[0].msg_id).messages
    assert [m.msg_id for m in found] == [sent[0].msg_id]
    message = found[0]
    assert message.topic == topic and message.tags == "TagA" and message.keys == ("order-0",)
    assert message.unique_key == sent[0].unique_key
    assert message.property("UNIQ_KEY") == sent[0].unique_key
    assert message.preview().json is not None
    position = message.position
    assert (position.broker, position.stored_topic) == ("broker-a", topic)
    assert position.queue_id == sent[0].queue.queue_id
    assert position.queue_offset == sent[0].queue_offset
    assert position.store_ms == sent[0].store_timestamp_ms and position.size_bytes > 0
    assert position.commitlog_offset >= 0 and position.store_host

    def key_found() -> bool:
        return len(by_key(admin, topic, "order-1").messages) == 2

    wait_until(key_found, "both messages with key order-1 indexed", WAIT_S)
    by_key_ids = {m.msg_id for m in by_key(admin, topic, "order-1").messages}
    assert by_key_ids == {sent[1].msg_id, other.msg_id}
    assert by_key(admin, topic, "order-none") == SearchResult(())  # nothing, not truncated
    assert by_unique_key(admin, topic, "C0FFEE") == SearchResult(())
    uniq = by_unique_key(admin, topic, other.unique_key).messages
    assert [m.msg_id for m in uniq] == [other.msg_id]
    assert uniq[0].property("p") == "v" and uniq[0].preview().replaced is False
    assert by_id(admin, "7F0000010000000000000000DEADBEEF").messages == ()

    begin = sent[1].store_timestamp_ms
    end = other.store_timestamp_ms + 1
    timed = by_time(admin, topic, begin, end)
    expected = {s.msg_id for s in [*sent, other] if begin <= s.store_timestamp_ms < end}
    assert {m.msg_id for m in timed.messages} == expected and not timed.truncated
    stores = [m.position.store_ms for m in timed.messages]
    assert stores == sorted(stores)
    future = int(time.time() * 1000) + 3_600_000
    assert by_time(admin, topic, future, future + 1000).messages == ()


def test_time_search_stops_at_its_result_limit(
    cluster: Cluster, admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = "T_console_search_many"
    cluster.create_topic(topic, queues=1)
    with Producer(cluster.gateway.listen) as producer:
        sent = [producer.send(topic, f"m{i}") for i in range(5)]
    monkeypatch.setattr("services.console.data.messages.SEARCH_MAX_RESULTS", 3)
    found = by_time(admin, topic, sent[0].store_timestamp_ms, sent[-1].store_timestamp_ms + 1)
    assert [m.msg_id for m in found.messages] == [s.msg_id for s in sent[:3]]
    assert "only the first 3 messages" in found.truncated


def test_bad_searches_say_what_to_fix(admin: Admin) -> None:
    with pytest.raises(InvalidArgument, match="give a message id"):
        by_id(admin, "  ")
    with pytest.raises(InvalidArgument, match="give the topic"):
        by_key(admin, "", "k")
    with pytest.raises(InvalidArgument, match="not before its end"):
        by_time(admin, "T_x", 2000, 1000)
    with pytest.raises(InvalidArgument, match="give the end"):
        by_time(admin, "T_x", 2000, 0)


def test_trace_of_deliveries_retries_and_dead_letter(cluster: Cluster, admin: Admin) -> None:
    topic = "T_console_trace"
    cluster.create_topic(topic, queues=1)
    queue = MessageQueue(topic, "broker-a", 0)
    with Producer(cluster.gateway.listen) as producer:
        first = producer.send(topic, "one", properties={"traceparent": TRACEPARENT})
        producer.send(topic, "two")
    with PullConsumer("G_console_trace_done", cluster.gateway.listen) as done:
        pulled = done.pull(queue, 0, max_messages=2).messages
        done.commit(queue, 2)
        # A retry copy (delay level 1: 1 s) and then the dead letter of the first message.
        done.send_back(pulled[0], delay_level=1)
        done.send_back(pulled[0], delay_level=-1)
    with PullConsumer("G_console_trace_behind", cluster.gateway.listen) as behind:
        behind.commit(queue, 0)

    admin.create_group("G_console_trace_done")  # listed; the other one is named
    template = "http://jaeger:16686/trace/{trace_id}"
    named = ["G_console_trace_behind", "G_console_trace_unrelated"]

    def copies_seen() -> bool:
        found = trace(admin, first.msg_id, template, named)
        done_group = {d.group: d for d in found.deliveries}["G_console_trace_done"]
        return bool(done_group.retries) and done_group.dead_letter is not None

    wait_until(copies_seen, "the retry copy and the dead letter indexed", WAIT_S)
    found = trace(admin, first.msg_id, template, named)
    assert found.message.msg_id == first.msg_id
    assert found.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert found.trace_url == "http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"
    groups = {d.group: d for d in found.deliveries}
    assert "G_console_trace_unrelated" not in groups  # no offset there, no copy
    assert groups["G_console_trace_done"].state is DeliveryState.CONSUMED
    assert groups["G_console_trace_done"].consumer_offset == 2
    assert groups["G_console_trace_behind"].state is DeliveryState.NOT_YET
    done_group = groups["G_console_trace_done"]
    assert done_group.retries[0].stored_topic == "%RETRY%G_console_trace_done"
    assert done_group.retries[0].reconsume_times == 1
    assert done_group.dead_letter is not None
    assert done_group.dead_letter.stored_topic == "%DLQ%G_console_trace_done"
    assert trace(admin, first.msg_id).trace_url == ""  # no template: no link
    with pytest.raises(NotFound):
        trace(admin, "7F0000010000000000000000DEADBEEF")


def test_time_search_stops_at_its_read_limit(
    cluster: Cluster, admin: Admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = "T_console_search_reads"
    cluster.create_topic(topic, queues=2)
    with Producer(cluster.gateway.listen) as producer:
        sent = [producer.send(topic, f"m{i}") for i in range(6)]
    assert {s.queue.queue_id for s in sent} == {0, 1}  # round robin: both queues hold some
    monkeypatch.setattr("services.console.data.messages.SEARCH_MAX_BROWSE_CALLS", 1)
    begin, end = sent[0].store_timestamp_ms, sent[-1].store_timestamp_ms + 1
    found = by_time(admin, topic, begin, end)
    # One read: the first queue's messages only, and the page is told so.
    first_queue = {s.msg_id for s in sent if s.queue.queue_id == 0}
    assert {m.msg_id for m in found.messages} == first_queue
    assert found.truncated == "the search stopped after 1 reads"
