"""allocate_averagely against a line-by-line port of RocketMQ's AllocateMessageQueueAveragely."""

from __future__ import annotations

import pytest

from tide.client import MessageQueue, allocate_averagely
from tide.client._allocate import owner_gone, owners


def rocketmq_allocate(mq_all: list[str], cid_all: list[str], current_cid: str) -> list[str]:
    """AllocateMessageQueueAveragely.allocate, ported statement by statement (inputs sorted
    by the caller, as RebalanceImpl does)."""
    result: list[str] = []
    if current_cid not in cid_all:
        return result
    index = cid_all.index(current_cid)
    mod = len(mq_all) % len(cid_all)
    if len(mq_all) <= len(cid_all):
        average_size = 1
    elif mod > 0 and index < mod:
        average_size = len(mq_all) // len(cid_all) + 1
    else:
        average_size = len(mq_all) // len(cid_all)
    start_index = index * average_size if mod > 0 and index < mod else index * average_size + mod
    range_ = min(average_size, len(mq_all) - start_index)
    for i in range(range_):
        result.append(mq_all[(start_index + i) % len(mq_all)])
    return result


def queues(topic: str, brokers: int, per_broker: int) -> list[MessageQueue]:
    return [
        MessageQueue(topic, f"broker-{b}", q) for b in range(brokers) for q in range(per_broker)
    ]


def ids(found: list[MessageQueue]) -> list[tuple[str, int]]:
    return [(q.broker_name, q.queue_id) for q in found]


def test_eight_queues_three_members() -> None:
    mqs = queues("T", 2, 4)
    members = ["c0", "c1", "c2"]
    assert ids(allocate_averagely(mqs, members, "c0")) == [
        ("broker-0", 0),
        ("broker-0", 1),
        ("broker-0", 2),
    ]
    assert ids(allocate_averagely(mqs, members, "c1")) == [
        ("broker-0", 3),
        ("broker-1", 0),
        ("broker-1", 1),
    ]
    assert ids(allocate_averagely(mqs, members, "c2")) == [("broker-1", 2), ("broker-1", 3)]


def test_more_members_than_queues_leaves_the_last_members_idle() -> None:
    mqs = queues("T", 1, 3)
    members = [f"c{i}" for i in range(5)]
    assert [len(allocate_averagely(mqs, members, m)) for m in members] == [1, 1, 1, 0, 0]


def test_unknown_member_and_no_queues_get_nothing() -> None:
    mqs = queues("T", 1, 4)
    assert allocate_averagely(mqs, ["a", "b"], "z") == []
    assert allocate_averagely([], ["a"], "a") == []


def test_inputs_are_sorted_first() -> None:
    mqs = queues("T", 2, 4)
    shuffled = list(reversed(mqs))
    assert allocate_averagely(shuffled, ["c1", "c0"], "c0") == allocate_averagely(
        mqs, ["c0", "c1"], "c0"
    )
    # sorted by broker name then queue id, as RocketMQ's MessageQueue.compareTo
    assert allocate_averagely(shuffled, ["c0"], "c0") == sorted(mqs)


def test_empty_member_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        allocate_averagely(queues("T", 1, 1), ["a"], "")


@pytest.mark.parametrize("queue_count", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 32])
@pytest.mark.parametrize("member_count", [1, 2, 3, 4, 5, 6, 8, 11, 33])
def test_matches_rocketmq(queue_count: int, member_count: int) -> None:
    mqs = queues("T", 1, queue_count)
    members = [f"client-{i:02d}" for i in range(member_count)]
    names = [str(q) for q in sorted(mqs)]
    by_name = {str(q): q for q in mqs}
    seen: list[MessageQueue] = []
    for member in members:
        ours = allocate_averagely(mqs, members, member)
        assert ours == [by_name[n] for n in rocketmq_allocate(names, members, member)]
        seen.extend(ours)
    # every queue is owned by exactly one member, and shares differ by at most one
    assert sorted(seen) == sorted(mqs)
    sizes = [len(allocate_averagely(mqs, members, m)) for m in members]
    assert max(sizes) - min(sizes) <= 1


def test_owners_maps_each_queue_to_its_member() -> None:
    mqs = queues("T", 2, 2)
    table = owners(mqs, ["b", "a"])
    assert table == {mqs[0]: "a", mqs[1]: "a", mqs[2]: "b", mqs[3]: "b"}


def test_takeover_is_immediate_only_when_no_live_member_may_own_the_queue() -> None:
    mqs = queues("T", 1, 4)
    before = owners(mqs, ["a", "b"])  # a: 0, 1; b: 2, 3
    # b left: a takes b's queues at once
    assert owner_gone(mqs[2], "a", before, ["a"])
    # c joined and got queue 1 from a, who is still a member: c waits
    assert not owner_gone(mqs[1], "c", before, ["a", "b", "c"])
    # a queue nobody owned before (a new queue) is free
    assert owner_gone(MessageQueue("T", "broker-9", 0), "c", before, ["a", "b", "c"])
    # first rebalance: wait unless alone
    assert not owner_gone(mqs[0], "a", None, ["a", "b"])
    assert owner_gone(mqs[0], "a", None, ["a"])
