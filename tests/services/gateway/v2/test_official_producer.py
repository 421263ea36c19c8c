"""The official RocketMQ 5 Python client's Producer against the gateway: normal, FIFO,
delay and transactional messages (commit, rollback, and an orphan resolved by the
check-back over Telemetry), each found through tide.v1 as sent."""

from __future__ import annotations

from pathlib import Path

from tests._cluster import RPC_TIMEOUT_S, Cluster
from tests.services.gateway.v2.rmq5 import of, run_client
from tide.format import SHARDING_KEY, TIMER_DELIVER_MS
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

DELAY_MS = 3_000  # rmq5_client.py's delay


def _stored(cluster: Cluster, topic: str, queues: int = 4) -> list[storage_pb.StoredMessage]:
    found: list[storage_pb.StoredMessage] = []
    for queue_id in range(queues):
        reply = cluster.gateway.stub.Pull(
            pb.PullRequest(
                consumer_group="V2_reader",
                topic=topic,
                broker_name="broker-a",
                queue_id=queue_id,
                offset=0,
                max_messages=64,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        found.extend(reply.messages)
    return found


def _by_id(cluster: Cluster, topic: str, count: int) -> dict[str, storage_pb.StoredMessage]:
    wait_until(
        lambda: len(_stored(cluster, topic)) >= count,
        f"{count} messages stored in {topic}",
        state=lambda: len(_stored(cluster, topic)),
    )
    return {m.properties["UNIQ_KEY"]: m for m in _stored(cluster, topic)}


def test_normal_messages_keep_id_tag_keys_and_properties(
    cluster: Cluster, topic_name: str, home: Path
) -> None:
    cluster.create_topic(topic_name, queues=4, message_type="NORMAL")
    sent = of(
        run_client(home, "produce", cluster.gateway.listen, topic_name, "--count", "6"), "sent"
    )
    assert len(sent) == 6
    stored = _by_id(cluster, topic_name, 6)
    for event in sent:
        message = stored[event["message_id"]]
        index = event["index"]
        assert message.body == f"body-{index}".encode()
        assert message.tags == "tag-a"
        assert list(message.keys) == [f"key-{index}"]
        assert message.properties["index"] == str(index)
    # round robin over the queues (the server picks: the client sets none)
    assert len({m.queue_id for m in stored.values()}) > 1


def test_fifo_messages_go_by_message_group(cluster: Cluster, topic_name: str, home: Path) -> None:
    cluster.create_topic(topic_name, queues=4, message_type="FIFO")
    args = ("produce", cluster.gateway.listen, topic_name, "--mode", "fifo", "--count", "8")
    sent = of(run_client(home, *args), "sent")
    stored = _by_id(cluster, topic_name, 8)
    queues_of: dict[str, set[int]] = {}
    for event in sent:
        message = stored[event["message_id"]]
        group = message.properties[SHARDING_KEY]
        assert group == f"group-{event['index'] % 2}"
        queues_of.setdefault(group, set()).add(message.queue_id)
    assert all(len(queues) == 1 for queues in queues_of.values()), queues_of
    # in each group, queue order is send order
    for group in queues_of:
        indexes = [
            int(m.properties["index"])
            for m in sorted(stored.values(), key=lambda m: m.queue_offset)
            if m.properties[SHARDING_KEY] == group
        ]
        assert indexes == sorted(indexes)


def test_delayed_messages_arrive_once_due(cluster: Cluster, topic_name: str, home: Path) -> None:
    cluster.create_topic(topic_name, queues=4, message_type="DELAY")
    args = ("produce", cluster.gateway.listen, topic_name, "--mode", "delay", "--count", "2")
    sent = of(run_client(home, *args), "sent")
    stored = _by_id(cluster, topic_name, 2)
    for event in sent:
        message = stored[event["message_id"]]
        # the client sends whole seconds: stored at least the delay less a second after
        # the message's birth (a lower bound: a loaded machine only delays it more)
        assert message.store_timestamp_ms - message.born_timestamp_ms >= DELAY_MS - 1_000
        assert TIMER_DELIVER_MS not in message.properties  # the delivered copy, not the timed one


def test_transactions_commit_roll_back_and_resolve_an_orphan_by_check(
    cluster: Cluster, topic_name: str, home: Path
) -> None:
    cluster.create_topic(topic_name, queues=4, message_type="TRANSACTION")
    events = run_client(home, "transaction", cluster.gateway.listen, topic_name)
    halves = {event["outcome"]: event["message_id"] for event in of(events, "half")}
    checked = of(events, "checked")
    assert [event["message_id"] for event in checked][:1] == [halves["orphan"]]
    assert checked[0]["topic"] == topic_name and checked[0]["properties"]["index"] == "2"
    stored = _by_id(cluster, topic_name, 2)
    assert set(stored) == {halves["commit"], halves["orphan"]}
