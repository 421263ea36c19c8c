"""A producer's record run checked in one call: the layout and the store's rules.

:func:`scan_run` checks the layout; the store then checks what the layout cannot say:
each topic (resolved once, by the caller: name and write queue count), the sys_flag bits
a producer may set, each queue id within its topic's write queues. :func:`check_run`
does both and answers what the append lock needs: each record's size, its queue key
(one ``(name, queue id)`` object per queue; None for a transaction prepared / rollback
record, which takes no queue offset) and the position of its store timestamp. The
compiled core's ``check_run`` when it runs; :func:`check_run_python` is its reference.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from functools import reduce
from operator import or_
from typing import TypeAlias, TypeVar, cast

from tide.format import _core
from tide.format._columns import CheckedRun
from tide.format._record import SYSFLAG_TRANSACTION_MASK, is_queue_less
from tide.format._record_run import scan_run_python

_Name = TypeVar("_Name", bound=Hashable)
# resolve(topic's UTF-8 bytes, index of its first record) -> (name, write queue count)
Resolve: TypeAlias = Callable[[bytes, int], tuple[_Name, int]]
_compiled = _core.check_run  # the twin of check_run_python, or None


def check_run(
    data: bytes | bytearray,
    max_body_bytes: int,
    max_records: int,
    resolve: Resolve[_Name],
    allowed_sys_flags: int,
) -> CheckedRun[_Name] | None:
    """The run's columns for the lock, or None when a record breaks a rule (a sys_flag
    bit outside ``allowed_sys_flags``, a queue id outside its topic's write queues: the
    caller names it). A layout check that fails raises RecordError naming the record
    (the reference's words), before ``resolve`` is called; ``resolve``'s own errors
    pass through."""
    if _compiled is not None:
        found = _compiled(data, max_body_bytes, max_records, resolve, allowed_sys_flags)
        if found is False:
            return None
        if found is not None:
            return cast("CheckedRun[_Name]", found)  # (a string: no alias built per call)
    return check_run_python(data, max_body_bytes, max_records, resolve, allowed_sys_flags)


def check_run_python(
    data: bytes | bytearray,
    max_body_bytes: int,
    max_records: int,
    resolve: Resolve[_Name],
    allowed_sys_flags: int,
) -> CheckedRun[_Name] | None:
    """:func:`check_run` in Python: the reference of ``tide.format._ccore.check_run``.

    The rules work on the columns: an or over the few distinct flags, a range check
    over the few distinct queue ids of a topic, one key per queue."""
    layout = scan_run_python(data, max_body_bytes, max_records)
    topics = {
        name: resolve(name, layout.topics.index(name)) for name in dict.fromkeys(layout.topics)
    }
    flags = reduce(or_, set(layout.sys_flags), 0)  # (the few distinct values)
    if flags & ~allowed_sys_flags:
        return None
    keys = _queue_keys(layout.topics, layout.queue_ids, topics)
    if keys is None:
        return None
    if flags & SYSFLAG_TRANSACTION_MASK:  # prepared / rollback records take no offset
        keys = [
            None if is_queue_less(sys_flag) else key
            for key, sys_flag in zip(keys, layout.sys_flags, strict=True)
        ]
    return layout.sizes, keys, layout.store_timestamp_positions


def _queue_keys(
    names: list[bytes], queue_ids: list[int], topics: dict[bytes, tuple[_Name, int]]
) -> list[tuple[_Name, int] | None] | None:
    """(name, queue id) per record, one object per queue; None when a queue id is
    outside its topic's write queues."""
    if len(topics) == 1:
        ((topic, count),) = topics.values()
        distinct = set(queue_ids)  # (min and max over the few queues, not the records)
        if min(distinct) < 0 or max(distinct) >= count:
            return None
        key_of = {queue_id: (topic, queue_id) for queue_id in distinct}
        return list(map(key_of.__getitem__, queue_ids))
    keys: list[tuple[_Name, int] | None] = []
    key_by_queue: dict[tuple[bytes, int], tuple[_Name, int]] = {}
    for name, queue_id in zip(names, queue_ids, strict=True):
        key = key_by_queue.get((name, queue_id))
        if key is None:
            topic, count = topics[name]
            if not 0 <= queue_id < count:
                return None
            key = key_by_queue[name, queue_id] = (topic, queue_id)
        keys.append(key)
    return keys
