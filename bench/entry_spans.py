"""GetQueueEntries' span selection, in-process: us a call and ns an entry of what the
dispatch does for one records pull (the consume queue's entries read, then picked and
grouped into spans), three ways alternating.

    python -m bench.entry_spans --rounds 5 --calls 2000

A consume queue in a temporary directory holds ``--entries`` entries of 128-byte
records as a batching producer leaves them (runs of ``--run`` records back to back, a
gap to the next run: the other queues' records), tags A or B at random. Each call reads
1024 entries from a random offset and selects up to 1024 of them, with no tag filter or
with a filter on A (half of them), as ``DispatchServicer._add_spans`` does:

* ``compiled``: ``ConsumeQueue.get_bytes`` + ``tide.format.select_spans``
  (``_ccore.entry_spans``);
* ``twin``: what ``TIDE_NO_EXTENSIONS=1`` runs: ``get_bytes`` with the pure-Python
  ``first_unwritten_python``, then ``select_spans_python``;
* ``old``: the path before s27-spans: the read with ``first_unwritten_python``, one
  tuple per entry (the consume queue's former ``get_units``: ``iter_entries`` of the
  runs into a list), then the former ``select_spans`` over the tuples, kept below for
  this comparison.

Rounds alternate the three; each round times ``--calls`` calls of each with
``time.process_time`` (CPU of this process, so other load on the box does not count);
the medians over the rounds are reported, with the load average.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from services.dispatch.engine import consume_queue
from services.dispatch.engine.consume_queue import ConsumeQueue
from tide.format import (
    PRE_BLANK_SIZE,
    UNLIMITED_BYTES,
    Span,
    Spans,
    _core,
    iter_entries,
    select_spans,
    tags_code,
)
from tide.format._consume_queue import first_unwritten_python
from tide.format._entry_spans import select_spans_python

PULL_ENTRIES = 1024  # PULL_MAX_MESSAGES: what one pull asks for at most
RECORD_BYTES = 128 + 100  # a 128-byte body and its record's header and properties
Way = Callable[[ConsumeQueue, int, frozenset[int]], Spans]
_FIRST_UNWRITTEN = getattr(consume_queue, "first_unwritten")  # noqa: B009 (not re-exported)


def old_select_spans(
    units: Sequence[tuple[int, int, int]],
    first_offset: int,
    max_count: int,
    tag_codes: Collection[int],
    max_bytes: int,
    next_offset: int,
) -> Spans:
    """services/dispatch/entry_spans.select_spans as it was before s27-spans."""
    limit = max_bytes or UNLIMITED_BYTES
    spans: list[Span] = []
    taken = total = start = size = count = 0
    end = -1
    for queue_offset, (offset, entry_size, code) in enumerate(units, first_offset):
        if taken >= max_count:
            break
        if (entry_size == PRE_BLANK_SIZE and offset == 0 and code == 0) or (
            tag_codes and code not in tag_codes
        ):
            next_offset = queue_offset + 1
            continue
        total += entry_size
        if total > limit and taken:
            if count:
                spans.append((start, size, count))
            return spans, queue_offset
        next_offset = queue_offset + 1
        taken += 1
        if offset == end:
            size += entry_size
            count += 1
        else:
            if count:
                spans.append((start, size, count))
            start, size, count = offset, entry_size, 1
        end = offset + entry_size
    if count:
        spans.append((start, size, count))
    return spans, next_offset


def compiled(queue: ConsumeQueue, offset: int, codes: frozenset[int]) -> Spans:
    entries = queue.get_bytes(offset, PULL_ENTRIES)
    return select_spans(entries, offset, PULL_ENTRIES, codes, 0, offset)


def twin(queue: ConsumeQueue, offset: int, codes: frozenset[int]) -> Spans:
    entries = queue.get_bytes(offset, PULL_ENTRIES)
    return select_spans_python(entries, offset, PULL_ENTRIES, codes, 0, offset)


def old(queue: ConsumeQueue, offset: int, codes: frozenset[int]) -> Spans:
    units = list(iter_entries(queue.get_bytes(offset, PULL_ENTRIES)))
    return old_select_spans(units, offset, PULL_ENTRIES, codes, 0, offset)


def filled_queue(root: Path, entries: int, run: int, rnd: random.Random) -> ConsumeQueue:
    queue = ConsumeQueue(root, "BenchTopic", 0)
    queue.load()
    queue.recover()
    codes = (tags_code("A"), tags_code("B"))
    offsets = [n * RECORD_BYTES + (n // run) * 7 * RECORD_BYTES for n in range(entries)]
    tags = [rnd.choice(codes) for _ in range(entries)]
    assert queue.put_run(range(entries), offsets, [RECORD_BYTES] * entries, tags) == entries
    return queue


def round_seconds(
    name: str, way: Way, queue: ConsumeQueue, starts: list[int], codes: frozenset[int]
) -> float:
    """CPU seconds of ``way`` on each start; the read's first_unwritten the one the way
    stands for (the module's global, which ConsumeQueue._written_runs calls)."""
    found = _FIRST_UNWRITTEN if name == "compiled" else first_unwritten_python
    setattr(consume_queue, "first_unwritten", found)  # noqa: B010 (not re-exported)
    began = time.process_time()
    for offset in starts:
        way(queue, offset, codes)
    return time.process_time() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=200_000, help="entries in the queue")
    parser.add_argument("--run", type=int, default=100, help="records back to back a run")
    parser.add_argument("--calls", type=int, default=2000, help="calls per way per round")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    args = parser.parse_args()
    rnd = random.Random(21)
    ways: dict[str, Way] = {"compiled": compiled, "twin": twin, "old": old}
    if _core.ccore is None:
        del ways["compiled"]
    with tempfile.TemporaryDirectory(prefix="tide-bench-spans-") as tmp:
        queue = filled_queue(Path(tmp), args.entries, args.run, rnd)
        starts = [rnd.randrange(args.entries - PULL_ENTRIES) for _ in range(args.calls)]
        for label, codes in (("no filter", frozenset()), ("tag A", frozenset({tags_code("A")}))):
            answers = {name: way(queue, starts[0], codes) for name, way in ways.items()}
            assert len({repr(a) for a in answers.values()}) == 1, "the ways disagree"
            seconds: dict[str, list[float]] = {name: [] for name in ways}
            for _ in range(args.rounds):
                for name, way in ways.items():
                    seconds[name].append(round_seconds(name, way, queue, starts, codes))
            print(f"{label}: {PULL_ENTRIES} entries a call, medians of {args.rounds} rounds")
            base = statistics.median(seconds["old"])
            for name, values in seconds.items():
                median = statistics.median(values)
                print(
                    f"  {name:9} {median / args.calls * 1e6:8.1f} us/call"
                    f" {median / args.calls / PULL_ENTRIES * 1e9:7.1f} ns/entry"
                    f"  ({base / median:.2f}x the old path)"
                )
        queue.close()
    print("load average: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
