"""The official RocketMQ 5 Python client's consumers against the gateway's POP
consumption (services/gateway/pop.py, the pop part of issue 20): SimpleConsumer receive
and ack, change of invisible duration, redelivery after expiry; PushConsumer success
and failure -> retry -> dead letter; SIGKILL of the gateway and of the storage during a
SimpleConsumer run (nothing lost; an acked message is never received again).

Messages are produced through tide.v1: what the consumer receives has the produced id
(UNIQ_KEY), tags, keys and user properties (one message model, two APIs)."""

from __future__ import annotations

import collections
import hashlib
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.gateway.v2.consume import AUTO_RENEW_INVISIBLE_MS
from tests._cluster import RPC_TIMEOUT_S, Cluster
from tests.services.gateway.v2.rmq5 import of, parse, run_client, start_client
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

INVISIBLE_S = 10  # the shortest invisible duration (POP_INVISIBLE_MIN_MS)


@pytest.fixture
def names(topic_name: str) -> tuple[str, str]:
    """(topic, group) of the test, short: POP's retry topic %RETRY%<group>_<topic> must
    stay within TOPIC_MAX_BYTES."""
    digest = hashlib.sha1(topic_name.encode()).hexdigest()[:8]
    return f"{topic_name[:36]}_{digest}", f"G_{digest}"


def _produce(cluster: Cluster, topic: str, count: int) -> dict[str, int]:
    """``count`` messages through tide.v1: unique key -> index."""
    reply = cluster.gateway.stub.Produce(
        pb.ProduceRequest(
            messages=[
                pb.ProduceMessage(
                    topic=topic,
                    body=f"body-{i}".encode(),
                    tags="TagA",
                    keys=[f"key-{i}"],
                    properties={"index": str(i)},
                )
                for i in range(count)
            ]
        ),
        timeout=RPC_TIMEOUT_S,
    )
    return {result.unique_key: i for i, result in enumerate(reply.results)}


def _lag(cluster: Cluster, group: str, topic: str) -> pb.GetGroupLagResponse:
    return cluster.gateway.stub.GetGroupLag(
        pb.GetGroupLagRequest(consumer_group=group, topic=topic), timeout=RPC_TIMEOUT_S
    )


def _check_identity(event: dict[str, Any], produced: dict[str, int]) -> None:
    index = produced[event["message_id"]]
    assert event["body"] == f"body-{index}"
    assert event["tag"] == "TagA"
    assert event["keys"] == [f"key-{index}"]
    assert event["properties"] == {"index": str(index)}


def _simple(
    cluster: Cluster, home: Path, topic: str, group: str, count: int, *more: str
) -> list[dict[str, Any]]:
    args = ("simple", cluster.gateway.listen, topic, group, "--count", str(count), *more)
    return run_client(home, *args)


def test_simple_consumer_receives_and_acks_what_tide_v1_produced(
    cluster: Cluster, names: tuple[str, str], home: Path
) -> None:
    topic_name, group = names
    cluster.create_topic(topic_name, queues=2)
    produced = _produce(cluster, topic_name, 10)
    events = _simple(cluster, home, topic_name, group, 10)
    received = of(events, "received")
    assert {e["message_id"] for e in of(events, "acked")} == set(produced)
    for event in received:
        _check_identity(event, produced)
        assert event["delivery_attempt"] == 1
    wait_until(
        lambda: _lag(cluster, group, topic_name).inflight == 0,
        "no message in flight once all are acked",
        state=lambda: _lag(cluster, group, topic_name),
    )
    assert _lag(cluster, group, topic_name).ready == 0


def test_unacked_messages_come_back_with_the_next_attempt(
    cluster: Cluster, names: tuple[str, str], home: Path
) -> None:
    topic_name, group = names
    cluster.create_topic(topic_name, queues=1)
    produced = _produce(cluster, topic_name, 1)
    first = _simple(
        cluster, home, topic_name, group, 1, "--no-ack", "--invisible-s", str(INVISIBLE_S)
    )
    assert [e["delivery_attempt"] for e in of(first, "received")] == [1]
    again = _simple(cluster, home, topic_name, group, 1)  # after the invisible time passed
    redelivered = of(again, "received")
    assert [e["message_id"] for e in redelivered] == list(produced)
    assert redelivered[0]["delivery_attempt"] == 2
    _check_identity(redelivered[0], produced)


def test_change_invisible_duration_gives_a_handle_the_ack_takes(
    cluster: Cluster, names: tuple[str, str], home: Path
) -> None:
    topic_name, group = names
    cluster.create_topic(topic_name, queues=1)
    produced = _produce(cluster, topic_name, 3)
    events = _simple(cluster, home, topic_name, group, 3, "--change-s", "30")
    assert {e["message_id"] for e in of(events, "changed")} == set(produced)
    assert {e["message_id"] for e in of(events, "acked")} == set(produced)
    assert not of(events, "error")
    wait_until(
        lambda: _lag(cluster, group, topic_name).inflight == 0,
        "acked with the changed handles: nothing in flight",
        state=lambda: _lag(cluster, group, topic_name),
    )


def test_push_consumer_consumes_each_message(
    cluster: Cluster, names: tuple[str, str], home: Path
) -> None:
    topic_name, group = names
    cluster.create_topic(topic_name, queues=2)
    produced = _produce(cluster, topic_name, 6)
    events = run_client(home, "push", cluster.gateway.listen, topic_name, group, "--count", "6")
    consumed = of(events, "consumed")
    assert {e["message_id"] for e in consumed} == set(produced)
    for event in consumed:
        _check_identity(event, produced)
    wait_until(
        lambda: _lag(cluster, group, topic_name).inflight == 0,
        "the push consumer acked what it consumed",
        state=lambda: _lag(cluster, group, topic_name),
    )


def test_push_consumer_failures_are_retried_then_dead_lettered(
    cluster: Cluster, names: tuple[str, str], home: Path
) -> None:
    topic_name, group = names
    cluster.create_topic(topic_name, queues=1)
    cluster.gateway.stub.CreateGroup(
        pb.CreateGroupRequest(
            group=storage_pb.GroupConfig(
                group_name=group,
                consume_enable=True,
                retry_queue_nums=1,
                retry_max_times=1,  # two attempts in all
                retry_policy=storage_pb.RetryPolicy(
                    type=storage_pb.RetryPolicy.CUSTOMIZED, delays_ms=[1000, 1000, 1000]
                ),
            )
        ),
        timeout=RPC_TIMEOUT_S,
    )
    produced = _produce(cluster, topic_name, 1)
    (message_id,) = produced
    args = ("push", cluster.gateway.listen, topic_name, group, "--count", "2", "--fail")
    consumed = of(run_client(home, *args), "consumed")
    assert [e["delivery_attempt"] for e in consumed] == [1, 2]
    assert {e["message_id"] for e in consumed} == {message_id}
    dead = f"%DLQ%{group}"

    def dead_letters() -> list[str]:
        try:  # a dead-letter topic is write-only (as RocketMQ's): browsed, not pulled
            reply = cluster.gateway.stub.BrowseQueue(
                pb.PullRequest(
                    consumer_group=f"{group}_dlq_reader",
                    topic=dead,
                    broker_name="broker-a",
                    queue_id=0,
                    offset=0,
                    max_messages=8,
                ),
                timeout=RPC_TIMEOUT_S,
            )
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return []  # the dead-letter topic is created with its first message
            raise
        return [m.properties.get("UNIQ_KEY", "") for m in reply.messages]

    # the last failure's ChangeInvisibleDuration may not go out before the program ends:
    # then the revive finds it when the push consumer's invisible time (60 s) is over
    wait_until(
        lambda: message_id in dead_letters(),
        f"{message_id} in {dead}",
        timeout_s=AUTO_RENEW_INVISIBLE_MS / 1000 + 60,
        state=dead_letters,
    )


def _settled(lag: pb.GetGroupLagResponse) -> bool:
    return lag.ready == 0 and lag.inflight == 0 and lag.delayed == 0


def _summary(events: list[dict[str, Any]], produced: dict[str, int], stderr: str) -> str:
    kinds = collections.Counter(event["event"] for event in events)
    acked = {e["message_id"] for e in of(events, "acked")}
    errors = [e for e in events if e["event"] == "error"][:5]
    return (
        f"events {dict(kinds)}; never acked: {len(set(produced) - acked)}; first errors: "
        f"{errors}\nstderr:\n{stderr[-3000:]}"
    )


@pytest.mark.parametrize("victim", ["gateway", "storage"])
def test_sigkill_during_a_simple_consumer_run_loses_nothing(
    cluster: Cluster, names: tuple[str, str], home: Path, victim: str
) -> None:
    topic, group = names
    cluster.create_topic(topic, queues=2)
    count = 40
    produced = _produce(cluster, topic, count)
    endpoint = cluster.gateway.listen
    process = start_client(
        home,
        "simple",
        endpoint,
        topic,
        group,
        "--count",
        str(count),
        "--invisible-s",
        str(INVISIBLE_S),
    )
    try:
        wait_until(
            lambda: _lag(cluster, group, topic).ready < count,
            "the consumer started receiving",
            state=lambda: _lag(cluster, group, topic),
        )
        if victim == "gateway":
            cluster.restart_gateway("--listen", endpoint, kill=True)  # same port
        else:
            master = cluster.brokers[0].master
            master.kill()  # SIGKILL its storage (and the dispatch beside it)
            cluster.restart(master)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    events = parse(stdout)
    assert process.returncode == 0, (
        f"{_summary(events, produced, stderr)}\nlag: {_lag(cluster, group, topic)}"
    )
    received = {e["message_id"] for e in of(events, "received")}
    assert received == set(produced)  # nothing lost
    acked_so_far: set[str] = set()
    for event in events:  # a message whose ack was answered is never received again
        if event["event"] == "received":
            assert event["message_id"] not in acked_so_far, event
        elif event["event"] == "acked":
            acked_so_far.add(event["message_id"])
    # and the server holds none of them: every one acked (an ack whose answer was lost
    # in the crash counts: the client saw an error, the broker had taken it)
    wait_until(
        lambda: _settled(_lag(cluster, group, topic)),
        "nothing ready, in flight or delayed for the group",
        state=lambda: _lag(cluster, group, topic),
    )
