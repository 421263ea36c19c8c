"""Dispatch replay benchmark: records/s through the Tail assembler and DispatchStore.apply.

    python -m bench.dispatch_apply --records 200000

Builds a commitlog byte stream of 128-byte messages in memory (8 queues of one topic,
one tag, with or without one key each), then measures, in-process: the assembler
(``tide.tail.RecordAssembler``: checks and splits records, as a dispatch does for every
Tail chunk) and ``DispatchStore.apply`` (consume queue entries + index entries).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from services.dispatch.engine.dispatch_store import DispatchConfig, DispatchStore
from tide.format import HostAddress, encode_properties, encode_record, pack_host, patch_record
from tide.tail import RecordAssembler

HOST = pack_host(HostAddress("127.0.0.1", 10911))
QUEUES = 8


def commitlog_bytes(records: int, with_keys: bool) -> bytes:
    data = bytearray()
    next_offsets = [0] * QUEUES
    body = b"x" * 128
    for i in range(records):
        props = {"TAGS": "TagA", **({"KEYS": f"key-{i}"} if with_keys else {})}
        queue_id = i % QUEUES
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


def run(records: int, with_keys: bool) -> str:
    data = commitlog_bytes(records, with_keys)
    start = time.perf_counter()
    batch = RecordAssembler(0).feed(0, data)
    assemble_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        store = DispatchStore(
            DispatchConfig(Path(tmp), index_slot_count=1_000_000, index_max_entries=4_000_000)
        )
        store.open()
        start = time.perf_counter()
        store.apply(batch)
        apply_s = time.perf_counter() - start
        store.close()
    total = assemble_s + apply_s
    return (
        f"| {'1 key' if with_keys else 'no key'} | {records:,} | {records / assemble_s:,.0f} | "
        f"{records / apply_s:,.0f} | {records / total:,.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="records per case")
    args = parser.parse_args()
    print("| keys | records | assembler records/s | apply records/s | together records/s |")
    print("|---|---|---|---|---|")
    for with_keys in (False, True):
        print(run(args.records, with_keys), flush=True)


if __name__ == "__main__":
    main()
