"""``tide dlq list|show|resend`` through the real entry point, in subprocesses, against a
real one-broker cluster whose dead letters are made with the client's send-back."""

from __future__ import annotations

import json

from tests._cluster import Cluster, cluster_fixture
from tests.cli.test_gateway_commands import ok, tide
from tide.client import MessageQueue, Producer, PullConsumer, ReceivedMessage
from tide.waiting import wait_until

cluster = cluster_fixture(brokers=1)
WAIT_S = 30.0


def pull_all(consumer: PullConsumer, topic: str, count: int) -> list[ReceivedMessage]:
    """The first ``count`` messages of ``topic``'s queue 0."""
    queue = MessageQueue(topic, "broker-a", 0)
    found: list[ReceivedMessage] = []

    def more() -> bool:
        result = consumer.pull(queue, len(found), max_messages=32)
        found.extend(result.messages)
        return len(found) >= count

    wait_until(more, f"{count} messages in {topic}", WAIT_S)
    return found


def dead_letter_two(cluster: Cluster, topic: str, group: str) -> list[ReceivedMessage]:
    """Produce three messages; send the first two to the group's dead-letter queue."""
    cluster.create_topic(topic, queues=1)
    with Producer(cluster.gateway.listen) as producer:
        for i in range(3):
            producer.send(
                topic, f"body-{i}", tags="TagA", keys=[f"k-{i}"], properties={"n": str(i)}
            )
    with PullConsumer(group, cluster.gateway.listen) as consumer:
        messages = pull_all(consumer, topic, 3)
        for message in messages[:2]:
            assert consumer.send_back(message, delay_level=-1).dead_lettered
    return messages


def test_list_show_and_resend(cluster: Cluster) -> None:
    topic, group = "T_cli_dlq", "G_cli_dlq"
    originals = dead_letter_two(cluster, topic, group)

    def listed() -> list[dict[str, object]]:
        document = json.loads(ok(tide(cluster, "dlq", "list", group, "--json")))
        letters: list[dict[str, object]] = document["dead_letters"]
        return letters

    wait_until(lambda: len(listed()) == 2, "two dead letters listed", WAIT_S)
    letters = listed()
    assert [d["original_topic"] for d in letters] == [topic, topic]
    assert [d["unique_key"] for d in letters] == [m.unique_key for m in originals[:2]]
    assert [d["keys"] for d in letters] == [["k-0"], ["k-1"]]
    assert [d["attempts"] for d in letters] == [1, 1]

    text = ok(tide(cluster, "dlq", "list", group)).splitlines()
    assert text[0].split() == ["MSG", "ID", "ORIGINAL", "TOPIC", "UNIQUE", "KEY", "KEYS",
                               "DEAD-LETTERED", "ATTEMPTS"]  # fmt: skip
    assert len(text) == 3 and topic in text[1]

    dead_id = str(letters[0]["msg_id"])
    shown = ok(tide(cluster, "dlq", "show", group, dead_id))
    assert "original topic" in shown and topic in shown
    assert originals[0].msg_id in shown  # the original msg id
    assert "body-0" in shown
    not_dead = tide(cluster, "dlq", "show", group, originals[2].msg_id)
    assert not_dead.returncode == 1
    assert f"not in %DLQ%{group}" in not_dead.stderr

    resent = tide(cluster, "dlq", "resend", group, "--all")
    assert resent.returncode == 0, resent.stderr
    assert "resent 2 of 2" in resent.stderr and f"they stay in %DLQ%{group}" in resent.stderr
    with PullConsumer("G_cli_dlq_check", cluster.gateway.listen) as consumer:
        again = pull_all(consumer, topic, 5)[3:]
    assert [m.body for m in again] == [b"body-0", b"body-1"]
    assert [m.unique_key for m in again] == [m.unique_key for m in originals[:2]]
    assert [m.keys for m in again] == [("k-0",), ("k-1",)]
    assert [m.tags for m in again] == ["TagA", "TagA"]
    assert [m.properties["n"] for m in again] == ["0", "1"]
    assert all("DLQ_ORIGIN_TOPIC" not in m.properties for m in again)
    assert len(listed()) == 2  # resending does not delete the dead letters

    # One by id.
    one = tide(cluster, "dlq", "resend", group, dead_id)
    assert one.returncode == 0 and "resent 1 of 1" in one.stderr


def test_usage_and_a_group_without_dead_letters(cluster: Cluster) -> None:
    empty = tide(cluster, "dlq", "list", "G_cli_no_dlq")
    assert empty.returncode == 0
    assert "group G_cli_no_dlq has no dead letters" in empty.stderr
    neither = tide(cluster, "dlq", "resend", "G_cli_no_dlq")
    assert neither.returncode == 1
    assert "give --all or one or more MSG_IDs" in neither.stderr
