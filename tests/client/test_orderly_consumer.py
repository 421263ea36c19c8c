"""Orderly push consumers with queue locks, as real processes: members added and
SIGKILLed while a FIFO topic is consumed. Every message group's messages are seen by
the application in send order (a hand-over may repeat the messages after the last
committed offset: counted and printed as duplicates), none lost, and no two members
ever deliver one queue at once (their delivery intervals, on the system-wide
monotonic clock, never overlap on a queue).

The check of order: in the order deliveries started, a group's next delivery is the
next message after the previous delivery, or an earlier one (a replay from the last
commit after a hand-over, its messages counted as duplicates) — never one further on.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests._cluster import Cluster
from tide.client import Message, Producer
from tide.spawn import spawn, stop, wait_ready
from tide.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
GROUPS = 40
PER_GROUP = 60
TOTAL = GROUPS * PER_GROUP
WAIT_S = 240.0


class Delivery:
    def __init__(self, line: str) -> None:
        member, start, end, queue, group, seq = line.split()
        self.member, self.queue, self.group = member, queue, group
        self.start_ns, self.end_ns, self.seq = int(start), int(end), int(seq)


def _read(record: Path) -> list[Delivery]:
    if not record.exists():
        return []
    lines = record.read_text().splitlines()
    return [Delivery(line) for line in lines if line.count(" ") == 5]


@contextmanager
def _member(
    cluster: Cluster, tmp: Path, group: str, topic: str, name: str
) -> Iterator[subprocess.Popen[bytes]]:
    ready = tmp / f"{name}.ready"
    log = (tmp / f"{name}.log").open("wb")
    child = spawn(
        [
            sys.executable,
            "-m",
            "tests.client._orderly_member",
            cluster.gateway.listen,
            group,
            topic,
            name,
            str(tmp / "record"),
        ],
        ready,
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(child, ready, f"member {name}", 60, stderr_path=tmp / f"{name}.log")
        yield child
    finally:
        if child.poll() is None:
            stop(child)
        log.close()


def _produce(cluster: Cluster, topic: str, rounds: range) -> None:
    """Each round one batch: the next message of every group (send order = round)."""
    with Producer(cluster.gateway.listen) as producer:
        for seq in rounds:
            batch = [
                Message(topic, f"g{g}/{seq}".encode(), sharding_key=f"g{g}") for g in range(GROUPS)
            ]
            producer.send_batch(batch)


def _check(deliveries: list[Delivery]) -> int:
    """Asserts order, completeness and exclusivity; returns the duplicates."""
    by_group: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in sorted(deliveries, key=lambda d: d.start_ns):
        by_group[delivery.group].append(delivery)
    assert len(by_group) == GROUPS
    duplicates = 0
    for group, seen in by_group.items():
        previous = -1
        highest = -1
        for delivery in seen:
            assert delivery.seq <= previous + 1, (
                f"{group}: {delivery.seq} delivered by {delivery.member} after {previous}"
            )
            if delivery.seq <= highest:
                duplicates += 1
            previous = delivery.seq
            highest = max(highest, delivery.seq)
        assert {d.seq for d in seen} == set(range(PER_GROUP)), f"{group}: messages lost"
    by_queue: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in deliveries:
        by_queue[delivery.queue].append(delivery)
    for queue, seen in by_queue.items():
        seen.sort(key=lambda d: d.start_ns)
        for before, after in itertools.pairwise(seen):
            if before.member != after.member:
                assert after.start_ns >= before.end_ns, (
                    f"{queue}: {after.member} started before {before.member} finished"
                )
    return duplicates


def test_members_added_and_sigkilled_keep_every_groups_order(
    cluster: Cluster, tmp_path: Path
) -> None:
    topic, group = "OrderlyKill", "orderly-kill"
    cluster.create_topic(topic, queues=4, message_type="FIFO")
    record = tmp_path / "record"
    _produce(cluster, topic, range(PER_GROUP // 2))
    with ExitStack() as members:
        members.enter_context(_member(cluster, tmp_path, group, topic, "a"))
        killed = members.enter_context(_member(cluster, tmp_path, group, topic, "b"))
        wait_until(lambda: len({d.member for d in _read(record)}) == 2, "a and b deliver", WAIT_S)
        members.enter_context(_member(cluster, tmp_path, group, topic, "c"))  # added
        producing = threading.Thread(
            target=_produce, args=(cluster, topic, range(PER_GROUP // 2, PER_GROUP))
        )
        producing.start()
        b_before = sum(d.member == "b" for d in _read(record))
        wait_until(  # b still busy after c joined: killed with queues in hand
            lambda: sum(d.member == "b" for d in _read(record)) >= b_before + 50,
            "b delivers after c joined",
            WAIT_S,
        )
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        producing.join()
        wait_until(
            lambda: len({(d.group, d.seq) for d in _read(record)}) == TOTAL,
            "every message delivered",
            WAIT_S,
            state=lambda: len({(d.group, d.seq) for d in _read(record)}),
        )
    deliveries = _read(record)
    duplicates = _check(deliveries)
    members_seen = sorted({d.member for d in deliveries})
    print(
        f"\norderly: {TOTAL} messages, {len(deliveries)} deliveries by {members_seen}, "
        f"{duplicates} duplicates around the hand-overs"
    )
    assert members_seen == ["a", "b", "c"]


def test_two_members_one_leaving_hands_over_after_its_unlock(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A member leaving through shutdown (SIGTERM) commits, then unlocks: the other takes
    its queues without waiting for a lease to expire, in order, none lost."""
    topic, group = "OrderlyLeave", "orderly-leave"
    cluster.create_topic(topic, queues=4, message_type="FIFO")
    record = tmp_path / "record"
    _produce(cluster, topic, range(PER_GROUP // 2))
    with ExitStack() as members:
        members.enter_context(_member(cluster, tmp_path, group, topic, "a"))
        leaving = members.enter_context(_member(cluster, tmp_path, group, topic, "b"))
        wait_until(lambda: len({d.member for d in _read(record)}) == 2, "both deliver", WAIT_S)
        producing = threading.Thread(
            target=_produce, args=(cluster, topic, range(PER_GROUP // 2, PER_GROUP))
        )
        producing.start()
        leaving.send_signal(signal.SIGTERM)
        assert leaving.wait(60) == 0
        producing.join()
        wait_until(
            lambda: len({(d.group, d.seq) for d in _read(record)}) == TOTAL,
            "every message delivered",
            WAIT_S,
        )
    deliveries = _read(record)
    duplicates = _check(deliveries)
    print(f"\norderly, a member leaving: {len(deliveries)} deliveries, {duplicates} duplicates")
