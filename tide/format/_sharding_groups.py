"""A produce batch's messages by the queue their sharding keys hash to (issue 21).

A FIFO producer batches messages of many message groups; each group's messages must go
to the queue its key hashes to (RocketMQ's SelectMessageQueueByHash:
``Math.abs(key.hashCode() % count)`` over the topic's writable queues sorted by broker
and queue id, :func:`tide.format.sharding_key_index`). The gateway splits such a batch
by queue and encodes one run per queue (services/gateway/produce_spread.py); hashing
each key in Python was the per-message loop left on that path. :func:`sharding_groups`
takes the compiled core's twin (``tide.format._ccore.sharding_groups``) when it
answers, else :func:`sharding_groups_python` (``TIDE_NO_EXTENSIONS=1``, or input the
compiled one declines: not an exact list of exact str, more than 65,536 queues). Both
give equal answers (tests/format/test_ccore_sharding_groups.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from tide.format import _core
from tide.format._javahash import sharding_key_index

# (queue index among the ``count`` queues, positions of the keys that hash to it, in order)
ShardingGroup: TypeAlias = tuple[int, list[int]]

__all__ = ["ShardingGroup", "sharding_groups", "sharding_groups_python"]


def sharding_groups(keys: list[str], count: int) -> list[ShardingGroup]:
    """The positions of ``keys`` by the queue each hashes to among ``count`` queues
    (>= 1), the queues in the order their first key comes; each queue's positions in
    order, so a message group keeps its order."""
    if _core.ccore is not None:
        found: list[ShardingGroup] | None = _core.ccore.sharding_groups(keys, count)
        if found is not None:
            return found
    return sharding_groups_python(keys, count)


def sharding_groups_python(keys: Sequence[str], count: int) -> list[ShardingGroup]:
    """:func:`sharding_groups` in Python (the reference of ``_ccore.sharding_groups``)."""
    if count < 1:
        raise ValueError("sharding_groups: count must be >= 1")
    groups: dict[int, list[int]] = {}
    previous: str | None = None
    index = -1
    for position, key in enumerate(keys):
        if key != previous:  # a group's messages often come back to back: hashed once
            index = sharding_key_index(key, count)
            previous = key
        positions = groups.get(index)
        if positions is None:
            groups[index] = [position]
        else:
            positions.append(position)
    return list(groups.items())
