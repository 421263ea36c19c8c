"""The pull's per-record work, in-process: records/s of the storage's span check
(``span_records``), the gateway's tag filter (``record_tags``) and the client's decoding
of pulled records (``decode_pull_records``).

    python -m bench.pull_spans --records 100000 --rounds 3

Builds ``--records`` stored records (128-byte bodies, one topic, a tag, a key and a
unique key each, IPv4 hosts), then times each step on them: the compiled core and the
pure-Python reference alternating, ``--rounds`` times each. Times are CPU times of this
process (``time.process_time``); the best round of each is reported.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from tide.client._records import decode_pull_records, decode_pull_records_python
from tide.format import (
    HostAddress,
    _core,
    encode_properties,
    encode_record,
    pack_host,
    patch_record,
)
from tide.format._record_spans import record_tags_python, span_records_python

HOST = pack_host(HostAddress("127.0.0.1", 10911))
Step = Callable[[bytes, int], object]


def stored_records(count: int) -> bytes:
    data = bytearray()
    for index in range(count):
        props = encode_properties({"TAGS": "TagA", "KEYS": f"k{index}", "UNIQ_KEY": f"u{index}"})
        rec = encode_record("BenchTopic", b"BenchTopic", 0, b"x" * 128, props, 0, 0, 1, HOST, HOST)
        pos = len(data)
        data += rec.data
        patch_record(data, pos, rec.store_timestamp_pos, index, pos, 1_000)
    return bytes(data)


def decode_python(data: bytes, count: int) -> object:
    return decode_pull_records_python("b", data, count)


def decode(data: bytes, count: int) -> object:
    return decode_pull_records("b", data, count)


def spans_python(data: bytes, count: int) -> object:
    return span_records_python(data, 0, count)


def steps() -> dict[str, tuple[Step, Step | None]]:
    """Each step's (reference, compiled or None when the core is not built)."""
    core = _core.ccore
    if core is None:
        return {
            "span_records": (spans_python, None),
            "record_tags": (record_tags_python, None),
            "decode_pull_records": (decode_python, None),
        }
    return {
        "span_records": (spans_python, lambda data, count: core.span_records(data, 0, count)),
        "record_tags": (record_tags_python, core.record_tags),
        "decode_pull_records": (decode_python, decode),
    }


def best_seconds(step: Step, data: bytes, count: int, best: float) -> float:
    started = time.process_time()
    step(data, count)
    return min(best, time.process_time() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000, help="records per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    args = parser.parse_args()
    data = stored_records(args.records)
    for name, (python, compiled) in steps().items():
        best_python = best_compiled = float("inf")
        for _ in range(args.rounds):
            best_python = best_seconds(python, data, args.records, best_python)
            if compiled is not None:
                best_compiled = best_seconds(compiled, data, args.records, best_compiled)
        line = f"{name:20} python {args.records / best_python / 1e6:6.2f} M records/s"
        if compiled is not None:
            line += (
                f"  compiled {args.records / best_compiled / 1e6:6.2f} M records/s"
                f"  ({best_python / best_compiled:.1f}x)"
            )
        print(line)


if __name__ == "__main__":
    main()
