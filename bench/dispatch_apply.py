"""Dispatch replay benchmark: records/s through the Tail assembler and DispatchStore.apply.

    python -m bench.dispatch_apply --records 200000

Builds a commitlog byte stream of 128-byte messages in memory (8 queues of one topic
taking turns, as one producer's round robin sends them, or in random order with
``--random-queues``, or ``--queue-runs N`` records to a queue before the next, as the
gateway appends produce requests of N records; one tag, or none with ``--no-tag``,
with or without one key each, and with a 32-character ``UNIQ_KEY`` each and no key:
what the gateway's records carry, the live shape of the index), cuts it into Tail
chunks (2 MiB, what the dispatcher asks for; ``--chunk-bytes``), then measures
in-process, chunk by chunk as a dispatch runs: the assembler
(``RecordAssembler.feed_chunk``: finds and checks the records of each chunk, in place)
and ``DispatchStore.apply`` of each chunk's batches (consume queue entries + index
entries).

Body CRCs are not checked, as the dispatch service does not check them by default
(``--verify-body-crc`` checks them, as the service's option of that name does).

The index has 1,000,000 hash slots (4 MB: mostly cached); ``--index-slot-count
5000000`` gives it the service's default (RocketMQ's), 20 MB of slots.

Times are CPU times of this process (``time.process_time``), per stage, so that other
load on the machine does not count; ``--wall`` reports wall-clock times instead.

    python -m bench.dispatch_apply --records 200000 --ab 5 [--ab-parts index|entries|both]

A/B in one process: the 1-key case, rounds alternating the compiled index put
(``tide.format.put_key_batch`` on ``_ccore.put_index_keys``) and/or the compiled
consume-queue entries' bytes (``tide.format.pack_entries`` on
``_ccore.consume_queue_entries``) with their pure-Python twins (``put_key_batch_python``,
``pack_entries_python``), everything else as this process runs it; each round's apply
records/s, then the medians and the load average.

    python -m bench.dispatch_apply --records 200000 --ab-zero-check 7

A/B in one process of the consume queue's check before a run's write (a ``pread`` of
the bytes about to be written, asserted zero): rounds alternating the check and none
(an ``assert`` that always holds, as under ``python -O``), the 1-key case.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from services.dispatch.dispatcher import TAIL_CHUNK_BYTES
from services.dispatch.engine import consume_queue
from services.dispatch.engine.dispatch_store import DispatchConfig, DispatchStore
from tide.format import (
    UNIQ_KEY,
    HostAddress,
    _consume_queue,
    _index_put,
    encode_properties,
    encode_record,
    pack_host,
    patch_record,
)
from tide.tail import RecordAssembler, RecordBatch

HOST = pack_host(HostAddress("127.0.0.1", 10911))
QUEUES = 8
# The index's hash slots (4 bytes each) unless --index-slot-count says otherwise; the
# service's default (RocketMQ's) is 5,000,000, a 20 MB table whose slots are cache and
# TLB misses, where this one's 4 MB mostly stays in a cache.
INDEX_SLOT_COUNT = 1_000_000
CHUNK_BYTES = TAIL_CHUNK_BYTES


@functools.cache
def commitlog_bytes(
    records: int,
    with_keys: bool,
    *,
    random_queues: bool = False,
    tag: bool = True,
    queue_runs: int = 1,
    uniq_key: bool = False,
) -> bytes:
    data = bytearray()
    next_offsets = [0] * QUEUES
    body = b"x" * 128
    rng = random.Random(7)
    for i in range(records):
        props = {**({"TAGS": "TagA"} if tag else {}), **({"KEYS": f"key-{i}"} if with_keys else {})}
        if uniq_key:  # as a client's message id: 32 hex digits
            props[UNIQ_KEY] = f"{rng.getrandbits(128):032X}"
        queue_id = rng.randrange(QUEUES) if random_queues else i // queue_runs % QUEUES
        rec = encode_record(
            "BenchTopic",
            b"BenchTopic",
            queue_id,
            body,
            encode_properties(props),
            0,
            0,
            1,
            HOST,
            HOST,
        )
        pos = len(data)
        data += rec.data
        patch_record(data, pos, rec.store_timestamp_pos, next_offsets[queue_id], pos, 1_000)
        next_offsets[queue_id] += 1
    return bytes(data)


def run(
    records: int,
    with_keys: bool,
    chunk_bytes: int,
    clock: Callable[[], float],
    *,
    verify_body_crc: bool = False,
    random_queues: bool = False,
    tag: bool = True,
    queue_runs: int = 1,
    uniq_key: bool = False,
    index_slot_count: int = INDEX_SLOT_COUNT,
) -> str:
    data = commitlog_bytes(
        records,
        with_keys,
        random_queues=random_queues,
        tag=tag,
        queue_runs=queue_runs,
        uniq_key=uniq_key,
    )
    chunks = [(pos, min(pos + chunk_bytes, len(data))) for pos in range(0, len(data), chunk_bytes)]
    assembler = RecordAssembler(0, check_crc=verify_body_crc)
    assemble_s = apply_s = 0.0
    applied = 0
    with tempfile.TemporaryDirectory() as tmp:
        store = DispatchStore(
            DispatchConfig(
                Path(tmp),
                index_slot_count=index_slot_count,
                index_max_entries=max(4_000_000, index_slot_count * 4),
            )
        )
        store.open()
        for offset, stop in chunks:
            start = clock()
            batches: list[RecordBatch] = assembler.feed_chunk(offset, data, offset, stop)
            assemble_s += clock() - start
            start = clock()
            for batch in batches:
                store.apply(batch)
            apply_s += clock() - start
            applied += sum(map(len, batches))
        assert applied == records and store.dispatched_offset == len(data), applied
        store.close()
    total = assemble_s + apply_s
    keys = "UNIQ_KEY" if uniq_key else "1 key" if with_keys else "no key"
    return (
        f"| {keys} | {records:,} | {records / assemble_s:,.0f} | "
        f"{records / apply_s:,.0f} | {records / total:,.0f} |"
    )


def _use_compiled(parts: tuple[str, ...], on: bool, saved: dict[str, object]) -> None:
    """The compiled index put and/or entries' bytes, or their Python twins."""
    if "index" in parts:
        _index_put.compiled_put = saved["index"] if on else None  # type: ignore[assignment]
    if "entries" in parts:
        _consume_queue._compiled_entries = saved["entries"] if on else None  # type: ignore[assignment]


def ab_twins(
    records: int, rounds: int, parts: tuple[str, ...], chunk_bytes: int, clock: Callable[[], float]
) -> None:
    """The 1-key case, the compiled ``parts`` and their Python twins alternating (module
    docstring)."""
    saved: dict[str, object] = {
        "index": _index_put.compiled_put,
        "entries": _consume_queue._compiled_entries,
    }
    if any(saved[part] is None for part in parts):
        raise SystemExit("the compiled core is off or not built: nothing to compare")
    applied: dict[str, list[float]] = {"compiled": [], "python": []}
    print(f"A/B of {' and '.join(parts)}; load average {' '.join(_load())}")
    print("| round | side | records | assembler records/s | apply records/s | together |")
    print("|---|---|---|---|---|---|")
    try:
        for number in range(1, rounds + 1):
            for side, values in applied.items():
                _use_compiled(parts, side == "compiled", saved)
                line = run(records, True, chunk_bytes, clock)
                values.append(float(line.split("|")[4].replace(",", "")))
                print(f"| {number} | {side} |{line.split('|', 2)[2]}", flush=True)
    finally:
        _use_compiled(parts, True, saved)
    medians = {side: statistics.median(values) for side, values in applied.items()}
    print(
        f"median apply records/s: compiled {medians['compiled']:,.0f}, python "
        f"{medians['python']:,.0f} ({medians['compiled'] / medians['python']:.2f}x); "
        f"load average after {' '.join(_load())}"
    )


def ab_zero_check(records: int, rounds: int, chunk_bytes: int, clock: Callable[[], float]) -> None:
    """The 1-key case with the consume queue's zero check and without it, alternating
    (module docstring)."""
    check = consume_queue._lands_on_zeros
    sides: dict[str, list[float]] = {"check": [], "none": []}
    print(f"A/B of the zero check; load average {' '.join(_load())}")
    try:
        for number in range(1, rounds + 1):
            order = list(sides) if number % 2 else list(reversed(sides))
            for side in order:
                consume_queue._lands_on_zeros = check if side == "check" else _no_check
                line = run(records, True, chunk_bytes, clock)
                sides[side].append(float(line.split("|")[4].replace(",", "")))
                print(f"| {number} | {side} |{line.split('|', 2)[2]}", flush=True)
    finally:
        consume_queue._lands_on_zeros = check
    medians = {side: statistics.median(values) for side, values in sides.items()}
    print(
        f"median apply records/s: check {medians['check']:,.0f}, none {medians['none']:,.0f} "
        f"({medians['check'] / medians['none']:.2f}x); load average after {' '.join(_load())}"
    )


def _no_check(segment: object, position: int, end: int) -> bool:
    return True


def _load() -> list[str]:
    return [f"{x:.2f}" for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per case")
    parser.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES, help="Tail chunk size")
    parser.add_argument("--wall", action="store_true", help="wall-clock instead of CPU time")
    parser.add_argument(
        "--verify-body-crc", action="store_true", help="check body CRCs (dispatch's option)"
    )
    parser.add_argument(
        "--random-queues", action="store_true", help="queues in random order, not round robin"
    )
    parser.add_argument(
        "--queue-runs",
        type=int,
        default=1,
        metavar="N",
        help="N records to a queue, then the next (a produce request of N records, as the"
        " gateway appends it); 1: the queues take turns record by record",
    )
    parser.add_argument(
        "--index-slot-count",
        type=int,
        default=INDEX_SLOT_COUNT,
        metavar="N",
        help=f"index hash slots (default {INDEX_SLOT_COUNT:,}; the service's: 5,000,000);"
        " entries per index file: 4x, at least 4,000,000",
    )
    parser.add_argument(
        "--no-tag", action="store_true", help="no TAGS property (as bench.dispatch_replay's)"
    )
    parser.add_argument(
        "--ab",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="A/B compiled parts against their Python twins (1 key), this many rounds",
    )
    parser.add_argument(
        "--ab-parts",
        choices=("index", "entries", "both"),
        default="index",
        help="what --ab compares: the index put, the consume-queue entries' bytes, both",
    )
    parser.add_argument(
        "--ab-zero-check",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="A/B the consume queue's zero check before a write against none, this many rounds",
    )
    args = parser.parse_args()
    clock = time.perf_counter if args.wall else time.process_time
    if args.ab_zero_check:
        ab_zero_check(args.records, args.ab_zero_check, args.chunk_bytes, clock)
        return
    if args.ab:
        parts = ("index", "entries") if args.ab_parts == "both" else (args.ab_parts,)
        ab_twins(args.records, args.ab, parts, args.chunk_bytes, clock)
        return
    print("| keys | records | assembler records/s | apply records/s | together records/s |")
    print("|---|---|---|---|---|")
    for with_keys, uniq_key in ((False, False), (True, False), (False, True)):
        line = run(
            args.records,
            with_keys,
            args.chunk_bytes,
            clock,
            verify_body_crc=args.verify_body_crc,
            index_slot_count=args.index_slot_count,
            random_queues=args.random_queues,
            tag=not args.no_tag,
            queue_runs=max(1, args.queue_runs),
            uniq_key=uniq_key,
        )
        print(line, flush=True)


if __name__ == "__main__":
    main()
