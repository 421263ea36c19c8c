"""POP's per-message work in one process, A/B alternating in the same run (issue 21):

    python -m bench.pop_records            # 5 rounds
    python -m bench.pop_records --json

* ``checkpoints``: a Receive's 32 checkpoints as 32 ``ck`` records (before) and as one
  checkpoint run record (``cks``, services/dispatch/pop/records.py ``checkpoint_runs``);
  µs per message and bytes per Receive;
* ``answer``: a 128-byte message's record decoded into the StoredMessage a PopMessages
  answers (tide.stored), with the host parses of tide.format uncached (before) and cached
  (``unpack_host``, ``msg_id_prefix``); µs per message.

Each round times A then B (then B then A the next round), so both see the same load."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import tide.format._hosts as hosts_module
import tide.stored as stored_module
from services.dispatch.pop.records import checkpoint_record, checkpoint_runs
from tide.format import (
    PopCheckpoint,
    decode_record,
    encode_properties,
    encode_record,
    pack_host,
    parse_host,
)

RECEIVE = 32
_HOST = pack_host(parse_host("10.0.0.7:41234"))
_RECORD = encode_record(
    "BenchPop",
    b"BenchPop",
    1,
    b"x" * 128,
    encode_properties({"UNIQ_KEY": "0A0000070000A0F2" * 2, "KEYS": "k1"}),
    0,
    0,
    1_764_000_000_000,
    _HOST,
    _HOST,
).data
_CK = PopCheckpoint(
    group="bench-pop",
    topic="BenchPop",
    queue_id=1,
    queue_offset=41,
    physical_offset=123_456_789,
    size=230,
    attempt=1,
    invisible_until_ms=1_764_000_000_000,
    fifo=False,
    origin_topic="BenchPop",
)
_CKS = [
    dataclasses.replace(_CK, queue_offset=41 + i, physical_offset=123_456_789 + 230 * i)
    for i in range(RECEIVE)
]


def _us_each(work: Callable[[], object], calls: int, per_call: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        work()
    return (time.perf_counter() - started) / (calls * per_call) * 1e6


def _answer(cached: bool) -> Callable[[], object]:
    """200 answers' messages; uncached: the cached host parses swapped for the plain ones
    they wrap for the call (and put back)."""
    patched = [(hosts_module, "_unpack_host"), (stored_module, "msg_id_prefix")]

    def run() -> object:
        saved = [getattr(module, name) for module, name in patched]
        if not cached:
            for (module, name), function in zip(patched, saved, strict=True):
                setattr(module, name, function.__wrapped__)
        try:
            return [
                stored_module.stored_message(decode_record(_RECORD, 0, len(_RECORD)))
                for _ in range(200)
            ]
        finally:
            for (module, name), function in zip(patched, saved, strict=True):
                setattr(module, name, function)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sides: dict[str, Callable[[], float]] = {
        "checkpoints_before": lambda: _us_each(
            lambda: b"".join(checkpoint_record(ck, 1) for ck in _CKS), 300, RECEIVE
        ),
        "checkpoints_after": lambda: _us_each(
            lambda: b"".join(checkpoint_runs(_CKS, 1)), 300, RECEIVE
        ),
        "answer_before": lambda: _us_each(_answer(cached=False), 20, 200),
        "answer_after": lambda: _us_each(_answer(cached=True), 20, 200),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    load_before = os.getloadavg()[0]
    for round_index in range(args.rounds):
        for pair in ("checkpoints", "answer"):
            order = ("before", "after") if round_index % 2 == 0 else ("after", "before")
            for side in order:
                times[f"{pair}_{side}"].append(sides[f"{pair}_{side}"]())
    result: dict[str, Any] = {
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "us_per_msg_median": {name: round(statistics.median(v), 2) for name, v in times.items()},
        "ratio_after_to_before": {
            pair: round(
                statistics.median(times[f"{pair}_after"])
                / statistics.median(times[f"{pair}_before"]),
                2,
            )
            for pair in ("checkpoints", "answer")
        },
        "bytes_per_receive": {
            "checkpoints_before": sum(len(checkpoint_record(ck, 1)) for ck in _CKS),
            "checkpoints_after": sum(len(r) for r in checkpoint_runs(_CKS, 1)),
        },
    }
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
