"""The dispatch's index put alone: ns a key, compiled and pure Python.

    python -m bench.index_put [--slot-count 5000000] [--rounds 5]

Puts batches of random key hashes (``--batch`` keys each, as one applied Tail chunk
carries; each with its commitlog offset and one store time) into a fresh index file of
the given geometry through ``tide.format.put_key_batch`` (the compiled core's
``put_index_keys`` and the fd path the dispatch uses: entries with ``pwrite``, slots
through the mapping) and its pure-Python twin ``put_key_batch_python``, rounds
alternating. The slot table is touched first, as a dispatch's has been by earlier puts,
so that page faults do not count; the columns are made before the clock starts. Times
are this process's CPU time a key (``time.process_time``).

The slot count decides what the put waits for: each key reads its slot, one random
4-byte word of the table. The service's default (RocketMQ's) is 5,000,000 slots, 20 MB,
larger than the caches: a cache and TLB miss a key (docs/performance.md, "The index put
waits for memory"). ``tide up`` gives its laptop-sized dispatch a quarter of its index
entries as slots (250,000: 1 MB).
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import statistics
import tempfile
import time

from tide.format import _index_put
from tide.format._index_file import (
    DEFAULT_INDEX_SLOT_COUNT,
    HASH_SLOT_BYTES,
    INDEX_HEADER_BYTES,
    IndexGeometry,
)

STORE_TIMESTAMP_MS = 1_700_000_000_000
RECORD_BYTES = 313  # target 1's stored record: the offsets' stride
Columns = tuple[list[int], list[int], list[int]]


def batches(keys: int, batch: int, seed: int) -> list[Columns]:
    """``keys`` random key hashes in batches of ``batch``, with offsets and a time."""
    rnd = random.Random(seed)
    out: list[Columns] = []
    offset = 0
    for start in range(0, keys, batch):
        count = min(batch, keys - start)
        hashes = [rnd.getrandbits(31) for _ in range(count)]
        offsets = list(range(offset, offset + count * RECORD_BYTES, RECORD_BYTES))
        offset += count * RECORD_BYTES
        out.append((hashes, offsets, [STORE_TIMESTAMP_MS] * count))
    return out


def ns_a_key(geometry: IndexGeometry, columns: list[Columns], compiled: bool) -> float:
    """CPU ns a key of putting ``columns`` into a fresh index file of ``geometry``."""
    put = _index_put.put_key_batch if compiled else _index_put.put_key_batch_python
    with tempfile.TemporaryFile() as file:
        file.truncate(geometry.file_bytes)
        with mmap.mmap(file.fileno(), geometry.file_bytes) as buf:
            # The slot pages mapped, as a dispatch's are once in use.
            buf[INDEX_HEADER_BYTES : geometry.entries_start] = bytes(
                geometry.entries_start - INDEX_HEADER_BYTES
            )
            keys = 0
            start = time.process_time()
            for hashes, offsets, stamps in columns:
                keys += put(buf, geometry, hashes, offsets, stamps, fd=file.fileno())
            spent = time.process_time() - start
    given = sum(len(hashes) for hashes, _, _ in columns)
    if keys != given:  # the geometry holds them all: anything less is a broken put
        raise RuntimeError(f"put {keys} keys of {given}")
    return spent / keys * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slot-count", type=int, default=DEFAULT_INDEX_SLOT_COUNT)
    parser.add_argument("--keys", type=int, default=400_000, help="keys a round (compiled)")
    parser.add_argument("--batch", type=int, default=400, help="keys a put (one Tail chunk's)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--python-keys", type=int, default=100_000, help="keys a round (the Python twin)"
    )
    args = parser.parse_args()
    geometry = IndexGeometry(args.slot_count, max(4 * args.slot_count, args.keys + 2))
    sides = {"compiled": args.keys, "python": args.python_keys}
    if _index_put.compiled_put is None:
        print("the compiled core is off or not built: the Python twin only")
        sides.pop("compiled")
    print(
        f"index put, {args.slot_count:,} slots ({args.slot_count * HASH_SLOT_BYTES / 1e6:g} MB), "
        f"batches of {args.batch}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print("| round | " + " | ".join(f"{side} ns/key" for side in sides) + " |")
    print("|---" * (len(sides) + 1) + "|")
    results: dict[str, list[float]] = {side: [] for side in sides}
    for number in range(1, args.rounds + 1):
        for side, keys in sides.items():
            columns = batches(keys, args.batch, seed=number)
            results[side].append(ns_a_key(geometry, columns, side == "compiled"))
        row = " | ".join(f"{results[side][-1]:.0f}" for side in sides)
        print(f"| {number} | {row} |", flush=True)
    print(
        "medians: "
        + ", ".join(
            f"{side} {statistics.median(values):.0f} ns/key" for side, values in results.items()
        )
    )


if __name__ == "__main__":
    main()
