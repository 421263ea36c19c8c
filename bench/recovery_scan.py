"""Recovery scan benchmark: GB/s of commitlog walked by recovery's record scan, in-process.

    python -m bench.recovery_scan --mib 64

Builds a commitlog segment in memory (``--mib`` MiB of records with 128-byte bodies, one
topic, 8 queues taking turns, a tag each), then times ``tide.format.replay_records``
over it, with body CRCs checked as recovery checks them: the compiled core and the
pure-Python reference (``replay_records_python``) alternating, ``--rounds`` times each.
Times are CPU times of this process (``time.process_time``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from tide.format import (
    HostAddress,
    _core,
    encode_properties,
    encode_record,
    pack_host,
    patch_record,
)
from tide.format._record import replay_records_python

Walk = Callable[[bytes, int, int, int, dict[tuple[str, int], int]], tuple[int, int]]
HOST = pack_host(HostAddress("127.0.0.1", 10911))
QUEUES = 8


def segment_bytes(mib: int) -> bytearray:
    data = bytearray()
    props = encode_properties({"TAGS": "TagA"})
    next_offsets = [0] * QUEUES
    index = 0
    while len(data) < mib << 20:
        queue_id = index % QUEUES
        rec = encode_record(
            "BenchTopic", b"BenchTopic", queue_id, b"x" * 128, props, 0, 0, 1, HOST, HOST
        )
        pos = len(data)
        data += rec.data
        patch_record(data, pos, rec.store_timestamp_pos, next_offsets[queue_id], pos, 1_000)
        next_offsets[queue_id] += 1
        index += 1
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=64, help="commitlog MiB to walk")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    args = parser.parse_args()
    data = bytes(segment_bytes(args.mib))
    walks: dict[str, Walk] = {"python": replay_records_python}
    if _core.replay_records is not None:
        compiled = _core.replay_records

        def walk_compiled(
            buf: bytes, pos: int, limit: int, base: int, table: dict[tuple[str, int], int]
        ) -> tuple[int, int]:
            return compiled(buf, pos, limit, base, True, 1 << 30, table)

        walks["compiled"] = walk_compiled
    print("| path | round | records | GB/s | records/s |")
    print("|---|---|---|---|---|")
    for round_number in range(args.rounds):
        for name, walk in walks.items():
            table: dict[tuple[str, int], int] = {}
            start = time.process_time()
            _, records = walk(data, 0, len(data), 0, table)
            took = time.process_time() - start
            print(
                f"| {name} | {round_number + 1} | {records:,} | {len(data) / took / 1e9:.2f} | "
                f"{records / took:,.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
