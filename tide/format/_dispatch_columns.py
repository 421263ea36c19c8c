"""The dispatch apply's per-batch column work: the record ends, each queue's records as
columns, the runs of records back to back (issue 21 target 4).

``DispatchStore.apply`` and the dispatch's tail cache did this in Python between the
compiled calls, a few microseconds a batch each; following live, ~300 batches a second
of ~500 records. Each function here takes the compiled core's twin
(``tide.format._ccore``: ``queue_entry_runs``, ``back_to_back_runs``) when it
answers, else its pure-Python reference below (``TIDE_NO_EXTENSIONS=1``, or input the
compiled one declines: columns that are not exact lists or array('q') of one length,
ints that do not fit in 64 bits, more than 64 queues in a batch). Both give equal answers
(tests/format/test_ccore_dispatch_columns.py).
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from collections.abc import Callable, Sequence
from itertools import accumulate, repeat
from operator import add, itemgetter
from typing import TypeAlias

from tide.format import _core
from tide.format._consume_queue import pack_entries_python
from tide.format._record import is_queue_less

# (topic, queue id, queue offsets, commitlog offsets, sizes, tags codes): the queue
# offsets an int (the first of a run of consecutive ones, more than one) or a sequence.
# The compiled core answers lists; the reference lists or tuples (what a pick gives),
# equal item by item.
QueueRun: TypeAlias = tuple[
    str, int, "int | Sequence[int]", Sequence[int], Sequence[int], Sequence[int]
]
# (topic, queue id, queue offsets, entries): as a QueueRun, the commitlog offsets, sizes
# and tags codes given as the consume-queue entries' bytes (``pack_entries``).
QueueEntryRun: TypeAlias = tuple[str, int, "int | Sequence[int]", bytes]
# (start offset, end offset, position of start in the batch's data)
BackToBackRun: TypeAlias = tuple[int, int, int]

__all__ = [
    "BackToBackRun",
    "QueueEntryRun",
    "QueueRun",
    "back_to_back_runs",
    "back_to_back_runs_python",
    "queue_entry_runs",
    "queue_entry_runs_python",
    "queue_runs_python",
    "record_ends_python",
]


def record_ends_python(positions: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """Where each record of a batch ends in its data: ``positions[i] + sizes[i]`` (what the
    pure-Python apply hands ``properties_between_python``; the compiled one adds them up
    itself)."""
    return list(map(add, positions, sizes))


def queue_runs_python(
    topics: list[str],
    queue_ids: Sequence[int],
    sys_flags: Sequence[int],
    queue_offsets: Sequence[int],
    offsets: Sequence[int],
    sizes: Sequence[int],
    codes: Sequence[int],
) -> list[QueueRun]:
    """The grouping rule of :func:`queue_entry_runs`, in Python (its reference uses it):
    the records that take a consume-queue entry (all but a transaction's prepared and
    rollback records), grouped by (topic, queue id) in the order the queues are first met
    (by any record of the batch): for each queue its queue offsets, commitlog offsets,
    sizes and tags codes, in commitlog order. The queue offsets are the first one (an
    int) when they are consecutive and more than one (one ``put_run``), else a sequence.
    Grouped without a Python step per record when the queues take turns (one producer's
    round robin), each queue's columns picked with C-speed slices or ``itemgetter``."""
    queue_ids, sys_flags, queue_offsets, offsets, sizes, codes = map(
        _as_list, (queue_ids, sys_flags, queue_offsets, offsets, sizes, codes)
    )
    runs: list[QueueRun] = []
    for (topic, queue_id), group in _groups(topics, queue_ids, sys_flags).items():
        pick: Callable[[list[int]], Sequence[int]]
        if isinstance(group, range):
            pick = itemgetter(slice(group.start, group.stop, group.step))
        elif len(group) > 1:
            pick = itemgetter(*group)  # (tuples: equal to the compiled lists item by item)
        else:
            pick = itemgetter(slice(group[0], group[0] + 1))
        picked = pick(queue_offsets)
        first, count = picked[0], len(picked)
        run = range(first, first + count)
        consecutive = count > 1 and (
            picked == list(run) if isinstance(picked, list) else picked == tuple(run)
        )
        runs.append(
            (
                topic,
                queue_id,
                first if consecutive else picked,
                pick(offsets),
                pick(sizes),
                pick(codes),
            )
        )
    return runs


def queue_entry_runs(
    topics: list[str],
    queue_ids: Sequence[int],
    sys_flags: Sequence[int],
    queue_offsets: Sequence[int],
    offsets: Sequence[int],
    sizes: Sequence[int],
    codes: Sequence[int],
) -> list[QueueEntryRun]:
    """The records that take a consume-queue entry grouped by queue (the rule of
    :func:`queue_runs_python`), each queue's entries as the bytes ``pack_entries`` makes
    of its offsets, sizes and tags codes: one compiled call from a batch's columns to
    what the consume queues write. Values that do not fit an entry raise (as
    ``pack_entries`` does)."""
    if _core.ccore is not None:
        runs: list[QueueEntryRun] | None = _core.ccore.queue_entry_runs(
            topics, queue_ids, sys_flags, queue_offsets, offsets, sizes, codes
        )
        if runs is not None:
            return runs
    return queue_entry_runs_python(
        topics, queue_ids, sys_flags, queue_offsets, offsets, sizes, codes
    )


def queue_entry_runs_python(
    topics: list[str],
    queue_ids: Sequence[int],
    sys_flags: Sequence[int],
    queue_offsets: Sequence[int],
    offsets: Sequence[int],
    sizes: Sequence[int],
    codes: Sequence[int],
) -> list[QueueEntryRun]:
    """:func:`queue_entry_runs` in Python (the reference of ``_ccore.queue_entry_runs``):
    :func:`queue_runs_python`, each queue's columns packed by ``pack_entries_python``
    (what ``ConsumeQueue.put_run`` did with them on this path)."""
    return [
        (topic, queue_id, firsts, pack_entries_python(run_offsets, run_sizes, run_codes))
        for topic, queue_id, firsts, run_offsets, run_sizes, run_codes in queue_runs_python(
            topics, queue_ids, sys_flags, queue_offsets, offsets, sizes, codes
        )
    ]


def _as_list(column: Sequence[int]) -> list[int]:
    """A column as a list (an array('q') of a batch converted once, at C speed): the
    references' slices, picks and comparisons are those of lists."""
    if isinstance(column, list):
        return column
    return column.tolist() if isinstance(column, array) else list(column)


def _groups(
    topics: list[str], queue_ids: list[int], sys_flags: list[int]
) -> dict[tuple[str, int], list[int] | range]:
    """Indexes of the records that take a queue entry, by queue, in the order the queues
    are first met: a range when the queues take turns (record ``i`` in the queue of
    record ``i + k``, ``k`` the number of queues), else a list."""
    count = len(topics)
    if not count:
        return {}
    if not len(queue_ids) == len(sys_flags) == count:
        raise ValueError("queue_entry_runs: columns of different lengths")
    single = topics.count(topics[0]) == count
    queue_less = any(is_queue_less(flag) for flag in set(sys_flags))
    if single and not queue_less:
        period = len(set(queue_ids))
        if period < count and queue_ids[period:] == queue_ids[:-period]:
            # (the first ``period`` ids are then the distinct ones)
            return {
                (topics[0], queue_ids[start]): range(start, count, period)
                for start in range(period)
            }
    groups: dict[tuple[str, int], list[int]]
    if single:  # one topic (the usual case): grouped by queue id, cheaper to hash
        by_id: defaultdict[int, list[int]] = defaultdict(list)
        for index, queue_id in enumerate(queue_ids):
            by_id[queue_id].append(index)
        topic = topics[0]
        groups = {(topic, queue_id): group for queue_id, group in by_id.items()}
    else:
        groups = defaultdict(list)
        for index, queue in enumerate(zip(topics, queue_ids, strict=True)):
            groups[queue].append(index)
    if queue_less:
        for queue, group in list(groups.items()):
            kept = [index for index in group if not is_queue_less(sys_flags[index])]
            if kept:
                groups[queue] = kept
            else:
                del groups[queue]
    return dict(groups)


def back_to_back_runs(
    offsets: Sequence[int], positions: Sequence[int], sizes: Sequence[int]
) -> list[BackToBackRun]:
    """A batch's records as runs back to back both in the commitlog and in its data:
    (start offset, end offset, position of start); a record joins the run before it when
    it starts where that run ends, in both. One run in the common case."""
    if _core.ccore is not None:
        runs: list[BackToBackRun] | None = _core.ccore.back_to_back_runs(offsets, positions, sizes)
        if runs is not None:
            return runs
    return back_to_back_runs_python(offsets, positions, sizes)


def back_to_back_runs_python(
    offsets: Sequence[int], positions: Sequence[int], sizes: Sequence[int]
) -> list[BackToBackRun]:
    """:func:`back_to_back_runs` in Python (the reference of
    ``_ccore.back_to_back_runs``): one run found with C-speed checks over the columns
    when all are back to back, else a step per record."""
    if not offsets:
        return []
    offsets, positions, sizes = map(_as_list, (offsets, positions, sizes))
    start, end = offsets[0], offsets[-1] + sizes[-1]
    shift = positions[0] - start
    if (
        len(offsets) == len(positions) == len(sizes)
        # each record starts where the one before ends, in the commitlog and in data
        and list(accumulate(sizes[:-1], initial=start)) == list(offsets)
        and list(positions) == list(map(add, offsets, repeat(shift)))
    ):
        return [(start, end, positions[0])]
    runs: list[BackToBackRun] = []
    start, position, end = offsets[0], positions[0], offsets[0] + sizes[0]
    for offset, pos, size in zip(offsets[1:], positions[1:], sizes[1:], strict=True):
        if offset == end and pos == position + (end - start):
            end += size
            continue
        runs.append((start, end, position))
        start, position, end = offset, pos, offset + size
    runs.append((start, end, position))
    return runs
