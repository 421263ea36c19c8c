"""Queue allocation within a consumer group: RocketMQ's AllocateMessageQueueAveragely.

Every member computes the same split from the same sorted inputs, so no coordinator is
needed: with 8 queues and 3 members, the first two members get 3 contiguous queues and
the last gets 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from tide.client._types import MessageQueue

Q = TypeVar("Q", bound=MessageQueue)


def allocate_averagely(queues: Sequence[Q], members: Sequence[str], member: str) -> list[Q]:
    """The queues ``member`` owns. Both lists are sorted first (RocketMQ's RebalanceImpl
    sorts them before calling the strategy); a member not in ``members`` owns nothing."""
    if not member:
        raise ValueError("member (the client id) is empty")
    all_queues = sorted(set(queues))
    all_members = sorted(set(members))
    if not all_queues or member not in all_members:
        return []
    index = all_members.index(member)
    queue_count = len(all_queues)
    member_count = len(all_members)
    mod = queue_count % member_count
    if queue_count <= member_count:
        average = 1
    elif mod > 0 and index < mod:
        average = queue_count // member_count + 1
    else:
        average = queue_count // member_count
    start = index * average if mod > 0 and index < mod else index * average + mod
    size = min(average, queue_count - start)
    return [all_queues[(start + i) % queue_count] for i in range(size)]


def owners(queues: Sequence[Q], members: Sequence[str]) -> dict[Q, str]:
    """Which member owns each queue under :func:`allocate_averagely`."""
    result: dict[Q, str] = {}
    for member in sorted(set(members)):
        for queue in allocate_averagely(queues, members, member):
            result[queue] = member
    return result


def owner_gone(
    queue: Q, member: str, previous_owners: dict[Q, str] | None, members: Sequence[str]
) -> bool:
    """Whether ``member``, newly assigned ``queue``, may take it at once: no other live
    member can still be consuming it. ``previous_owners`` is the split of the member's
    previous view of the group (None at its first rebalance, when others may own it unless
    the member is alone)."""
    if previous_owners is None:
        return list(members) == [member]
    owner = previous_owners.get(queue)
    return owner is None or owner == member or owner not in members
