"""The dead-letters page's data against a real one-broker cluster: a group's dead letters
paged, and resend jobs with progress, idempotent per message."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.console.data.dead_letters import list_page
from services.console.data.resend import Progress, ResendJobs
from tests._cluster import Cluster
from tide.client import (
    Admin,
    InvalidArgument,
    MessageQueue,
    NotFound,
    Producer,
    PullConsumer,
    ReceivedMessage,
    ResourceExhausted,
)
from tide.waiting import wait_until


@pytest.fixture(scope="module")
def cluster(console_cluster: Cluster) -> Cluster:
    """The console tests' one cluster (tests/services/console/conftest.py)."""
    return console_cluster


WAIT_S = 30.0


@pytest.fixture(scope="module")
def admin(cluster: Cluster) -> Iterator[Admin]:
    with Admin(cluster.gateway.listen) as client:
        yield client


def dead_letter(cluster: Cluster, topic: str, group: str, count: int) -> list[ReceivedMessage]:
    """Produce ``count`` messages to ``topic`` and send each to ``group``'s DLQ."""
    cluster.create_topic(topic, queues=1)
    queue = MessageQueue(topic, "broker-a", 0)
    with Producer(cluster.gateway.listen) as producer:
        for i in range(count):
            producer.send(
                topic, f"body-{i}", tags="TagA", keys=[f"k-{i}"], properties={"n": f"{i}"}
            )
    with PullConsumer(group, cluster.gateway.listen) as consumer:
        found: list[ReceivedMessage] = []

        def pulled() -> bool:
            found.extend(consumer.pull(queue, len(found), max_messages=32).messages)
            return len(found) >= count

        wait_until(pulled, f"{count} messages in {topic}", WAIT_S)
        for message in found:
            assert consumer.send_back(message, delay_level=-1).dead_lettered
    return found


def topic_bodies(cluster: Cluster, topic: str) -> list[bytes]:
    with PullConsumer("G_console_dlq_reader", cluster.gateway.listen) as consumer:
        result = consumer.pull(MessageQueue(topic, "broker-a", 0), 0, max_messages=64)
    return [m.body for m in result.messages]


def finished(jobs: ResendJobs, owner: str, job_id: str) -> Progress:
    wait_until(lambda: jobs.progress(owner, job_id).finished, "the resend job ends", WAIT_S)
    return jobs.progress(owner, job_id)


def test_list_pages_through_the_dead_letters(cluster: Cluster, admin: Admin) -> None:
    topic, group = "T_console_dlq_pages", "G_console_dlq_pages"
    originals = dead_letter(cluster, topic, group, 5)
    wait_until(lambda: list_page(admin, group).total == 5, "five dead letters", WAIT_S)

    first = list_page(admin, group, page_size=2)
    assert [d.message.unique_key for d in first.letters] == [m.unique_key for m in originals[:2]]
    assert first.letters[0].original_topic == topic
    assert first.letters[0].original_msg_id == originals[0].msg_id
    assert first.letters[0].attempts == 1 and first.letters[0].first_stored_ms > 0
    assert first.next_cursor == "broker-a/0/2"
    second = list_page(admin, group, first.next_cursor, page_size=2)
    last = list_page(admin, group, second.next_cursor, page_size=2)
    assert len(second.letters) == 2 and len(last.letters) == 1 and last.next_cursor == ""
    assert list_page(admin, "G_console_dlq_never").letters == ()
    with pytest.raises(InvalidArgument, match="names no queue"):
        list_page(admin, group, "broker-z/0/0")
    with pytest.raises(InvalidArgument, match="page size is 0"):
        list_page(admin, group, page_size=0)


def test_resend_selected_then_all_is_idempotent(cluster: Cluster, admin: Admin) -> None:
    topic, group = "T_console_dlq_resend", "G_console_dlq_resend"
    originals = dead_letter(cluster, topic, group, 3)
    wait_until(lambda: list_page(admin, group).total == 3, "three dead letters", WAIT_S)
    letters = list_page(admin, group).letters
    gateway = cluster.gateway.listen
    jobs = ResendJobs(max_jobs=2, concurrency=2)

    def start(msg_ids: list[str], owner: str = "alice") -> str:
        return jobs.start(owner, group, msg_ids, lambda: Admin(gateway), lambda: Producer(gateway))

    one = letters[0].message.msg_id
    job = start([one, one])  # the same one twice: once
    progress = finished(jobs, "alice", job)
    assert (progress.total, progress.done, progress.failed, progress.skipped) == (1, 1, 0, 0)
    assert progress.handled == 1 and progress.errors == ()
    with pytest.raises(NotFound, match="no such resend job"):
        jobs.progress("mallory", job)  # only its owner reads it

    def resent_indexed() -> bool:
        return len(admin.query_unique_key(topic, originals[0].unique_key)) == 2

    wait_until(resent_indexed, "the resent copy indexed by its unique key", WAIT_S)
    everything = finished(jobs, "alice", start([]))
    assert (everything.total, everything.done, everything.skipped) == (3, 2, 1)
    wait_until(lambda: len(topic_bodies(cluster, topic)) == 6, "three copies back", WAIT_S)
    resent = topic_bodies(cluster, topic)[3:]
    assert sorted(resent) == [b"body-0", b"body-1", b"body-2"]

    def all_indexed() -> bool:
        return all(len(admin.query_unique_key(topic, m.unique_key)) == 2 for m in originals)

    wait_until(all_indexed, "every resent copy indexed", WAIT_S)
    again = finished(jobs, "alice", start([]))
    assert (again.total, again.done, again.skipped) == (3, 0, 3)
    assert len(topic_bodies(cluster, topic)) == 6  # nothing sent twice
    assert list_page(admin, group).total == 3  # the dead letters stay


def test_resend_failures_are_counted_and_jobs_are_bounded(cluster: Cluster) -> None:
    gateway = cluster.gateway.listen
    jobs = ResendJobs(max_jobs=1, concurrency=1)
    job = jobs.start(
        "bob",
        "G_console_dlq_other",
        ["7F0000010000000000000000DEADBEEF"],
        lambda: Admin(gateway),
        lambda: Producer(gateway),
    )
    progress = finished(jobs, "bob", job)
    assert (progress.total, progress.failed) == (0, 1)
    assert "7F0000010000000000000000DEADBEEF" in progress.errors[0]
    # Finished jobs make room; a job's clients are its own.
    second = jobs.start(
        "bob", "G_console_dlq_other", [], lambda: Admin(gateway), lambda: Producer(gateway)
    )
    assert finished(jobs, "bob", second).total == 0
    with pytest.raises(NotFound):
        jobs.progress("bob", job)  # forgotten for the second
    with pytest.raises(ResourceExhausted, match="at most"):
        jobs.start("bob", "g", ["x"] * 10_001, lambda: Admin(gateway), lambda: Producer(gateway))
