"""The storage's per-message record codec work in one process (issue 21):

    python -m bench.stored_read                  # 5 rounds, µs per message
    python -m bench.stored_read --json
    python bench/stored_read.py                  # the same, on the tree in PYTHONPATH

* ``read``: a Read of 100 128-byte messages by position from an in-process store, as
  the servicer answers it (services/storage/position_read.py: the records' StoredMessage
  fields, services/storage/convert.py, into a ``ReadResponse``);
* ``encode``: a field-per-message Append's validation and encoding
  (``MessageCodec.encode_batch``, services/storage/engine/message_codec.py) of a batch
  of 100 such ``tide.v1.Message``s, without the append; ``encode_tag_only``: the same
  with a tag alone (bench/storage_append.py's messages).

Runs on whichever tree ``services`` and ``tide`` import from, so an A/B of two trees is
this file run alternately with PYTHONPATH set to each (docs/benchmarks.md); with
``TIDE_NO_EXTENSIONS=1`` it times the pure-Python path. The time is the timing thread's
CPU time (``time.thread_time``: what a message costs, not how long it waited for a core
on a shared machine); each figure is the median of the rounds."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from services.storage import convert
from services.storage.engine.commitlog import CommitLog
from services.storage.engine.config import StoreConfig
from services.storage.engine.message_codec import MessageCodec
from services.storage.engine.message_store import MessageStore
from tide.format import parse_host
from tide.format._core import using_extensions
from tide.v1 import storage_pb2 as pb

try:
    from services.storage.position_read import read_positions
except ImportError:  # a tree before it (an A/B's "before"): the servicer's loop of then
    read_positions = None  # type: ignore[assignment]

BATCH = 100
BODY_BYTES = 128
TOPIC = "bench-topic"
QUEUE_COUNTS = {TOPIC: 4}
STORE_HOST = "10.0.0.1:10911"
BORN_HOST = "10.0.0.7:41234"
MAX_BODY_BYTES = 4 << 20
MAX_READ_BYTES = 64 << 20  # the servicer's


def messages() -> list[pb.Message]:
    return [
        pb.Message(
            topic=TOPIC,
            queue_id=n % 4,
            body=bytes([n % 251]) * BODY_BYTES,
            tags="TagA",
            keys=[f"key-{n}"],
            properties={"UNIQ_KEY": f"7F000001{n:024X}"},
            born_timestamp_ms=1_800_000_000_000 + n,
        )
        for n in range(BATCH)
    ]


def read_positions_before(
    commitlog: CommitLog, positions: list[pb.ReadRequest.Position], hosts: dict[bytes, str]
) -> pb.ReadResponse:
    """The servicer's Read of positions before services/storage/position_read.py (a tree
    without it): each record read and decoded on its own (sized positions only)."""
    response = pb.ReadResponse()
    add = response.results.add
    for pos in positions:
        _, data = commitlog.read_raw(pos.physical_offset, pos.size)
        fields = convert.stored_message_fields(data, pos.physical_offset, hosts)
        assert fields is not None
        add(status=pb.FOUND, message=fields)
    return response


def time_read(store: MessageStore, calls: int) -> float:
    batch = store.put(messages(), BORN_HOST).batch
    positions = [
        pb.ReadRequest.Position(physical_offset=offset, size=size)
        for offset, size in zip(batch.physical_offsets, batch.sizes, strict=True)
    ]
    total = sum(batch.sizes)
    hosts: dict[bytes, str] = {}
    commitlog = store.commitlog
    started = time.thread_time()
    for _ in range(calls):
        if read_positions is None:
            response = read_positions_before(commitlog, positions, hosts)
        else:
            response = read_positions(commitlog, positions, hosts, total, MAX_READ_BYTES)
        assert len(response.results) == len(positions)
    return (time.thread_time() - started) / (calls * len(positions)) * 1e6


def time_encode(codec: MessageCodec, calls: int, tag_only: bool = False) -> float:
    batch = messages()
    if tag_only:  # bench/storage_append.py's messages: a tag, no key, no property
        batch = [
            pb.Message(topic=m.topic, queue_id=m.queue_id, body=m.body, tags="TagA") for m in batch
        ]
    started = time.thread_time()
    for _ in range(calls):
        codec.encode_batch(batch, QUEUE_COUNTS, BORN_HOST)
    return (time.thread_time() - started) / (calls * len(batch)) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300, help="batches of 100 per round")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    codec = MessageCodec(parse_host(STORE_HOST), MAX_BODY_BYTES)
    codec.topic_bytes(TOPIC)
    with tempfile.TemporaryDirectory(prefix="stored-read-") as root:
        store = MessageStore(StoreConfig(store_dir=Path(root), segment_size_bytes=64 << 20))
        store.open()
        try:
            store.topics.ensure(TOPIC, QUEUE_COUNTS[TOPIC])
            cases: dict[str, Callable[[], float]] = {
                "read": lambda: time_read(store, args.calls),
                "encode": lambda: time_encode(codec, args.calls),
                "encode_tag_only": lambda: time_encode(codec, args.calls, tag_only=True),
            }
            for run in cases.values():
                run()  # warm-up
            figures: dict[str, list[float]] = {name: [] for name in cases}
            for _ in range(args.rounds):
                for name, run in cases.items():
                    figures[name].append(run())
        finally:
            store.close()
    result = {
        "compiled": using_extensions(),
        "loadavg_1m": os.getloadavg()[0],
        **{f"{name}_us_per_msg": statistics.median(values) for name, values in figures.items()},
    }
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")


if __name__ == "__main__":
    main()
