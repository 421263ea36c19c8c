"""The batch scan (ChunkScanner via RecordAssembler.feed_batch) against the per-record path.

Every test compares what a chunk-at-a-time scan gives with what ``scan_record`` says of
each record (fields, boundaries, errors and their offsets), over streams that mix the
records the scan takes (V1 magic, IPv4 hosts) with those it leaves to ``scan_record`` (V2
magic, IPv6 hosts), blank markers, and chunk cuts anywhere.
"""

from __future__ import annotations

import gc
import itertools
import random
import struct

import pytest

from tide.format import (
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    ScanKind,
    encode_properties,
    encode_record,
    pack_host,
    parse_host,
    patch_record,
    scan_record,
    write_blank,
)
from tide.format import properties_position as properties_start
from tide.tail import (
    RecordAssembler,
    RecordAt,
    RecordBatch,
    TailCorruptionError,
    TailProtocolError,
    gc_paused,
)
from tide.tail._batch import BatchBuilder, ChunkScanner

HOST4 = pack_host(parse_host("10.0.0.7:10911"))
HOST6 = pack_host(parse_host("[::1]:10911"))
SEGMENT = 4096


def make_record(
    offset: int,
    body: bytes,
    *,
    topic: str = "BatchTopic",
    queue_id: int = 1,
    queue_offset: int = 0,
    props: dict[str, str] | None = None,
    v6: bool = False,
    store_ms: int = 5_000,
) -> bytes:
    sys_flag = SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6 if v6 else 0
    host = HOST6 if v6 else HOST4
    encoded = encode_record(
        topic,
        topic.encode(),
        queue_id,
        body,
        encode_properties(props if props is not None else {"TAGS": "t", "KEYS": "k"}),
        0,
        sys_flag,
        1_000,
        host,
        host,
    )
    data = bytearray(encoded.data)
    patch_record(data, 0, encoded.store_timestamp_pos, queue_offset, offset, store_ms)
    return bytes(data)


def random_stream(
    rnd: random.Random, count: int, *, start: int = 0, blanks: bool = True
) -> tuple[bytes, list[int]]:
    """Records (some V2, some IPv6, various sizes and topics) from ``start``, with blank
    markers at segment ends (segments of SEGMENT bytes) when ``blanks``; the stream
    bytes (filler included) and the record offsets."""
    out = bytearray()
    offsets: list[int] = []
    offset = start
    for index in range(count):
        topic = rnd.choice(["A", "BatchTopic", "T" * 130, "Tópico"])
        body = bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 1, 5, 128, 300])))
        props = rnd.choice(
            [{}, {"TAGS": "x"}, {"KEYS": f"k{index} k{index + 1}", "UNIQ_KEY": f"U{index}"}]
        )
        data = make_record(
            offset,
            body,
            topic=topic,
            queue_id=index % 3,
            queue_offset=index,
            props=props,
            v6=rnd.random() < 0.1,
            store_ms=5_000 + index,
        )
        room = SEGMENT - offset % SEGMENT
        if blanks and len(data) + 8 > room:
            blank = bytearray(room)
            write_blank(blank, 0, room)
            out += blank
            offset += room
            data = make_record(
                offset,
                body,
                topic=topic,
                queue_id=index % 3,
                queue_offset=index,
                props=props,
                store_ms=5_000 + index,
            )
        out += data
        offsets.append(offset)
        offset += len(data)
    return bytes(out), offsets


def feed_in_chunks(
    assembler: RecordAssembler, start: int, stream: bytes, cuts: list[int]
) -> RecordBatch:
    builder_batches: list[RecordBatch] = []
    bounds = [0, *sorted(set(cuts)), len(stream)]
    for a, b in itertools.pairwise(bounds):
        if b > a:
            builder_batches.append(assembler.feed_batch(start + a, stream[a:b]))
    records = [rec for batch in builder_batches for rec in batch.records()]
    return RecordBatch.from_records(records)


def check_batch(batch: RecordBatch, stream: bytes, start: int, offsets: list[int]) -> None:
    """Every column of ``batch`` is what scan_record says of the record at its offset."""
    assert list(batch.offsets) == offsets
    for index, offset in enumerate(offsets):
        scan = scan_record(stream, offset - start, len(stream), expected_offset=offset)
        assert scan.kind is ScanKind.RECORD
        assert batch.sizes[index] == scan.size
        assert batch.record_bytes(index) == stream[offset - start : offset - start + scan.size]
        assert batch.queue_ids[index] == scan.queue_id
        assert batch.queue_offsets[index] == scan.queue_offset
        assert batch.sys_flags[index] == scan.sys_flag
        assert batch.store_timestamps[index] == scan.store_timestamp_ms
        assert batch.topics[index] == scan.topic
        data = batch.record_bytes(index)
        assert batch.body_crcs[index] == struct.unpack_from(">I", data, 8)[0]
        assert batch.properties_bytes(index) == data[properties_start(data) :]
        assert batch.record(index) == RecordAt(offset, scan.size, scan, data)


def test_one_chunk_of_mixed_records_matches_scan_record() -> None:
    stream, offsets = random_stream(random.Random(1), 120)
    batch = RecordAssembler(0).feed_batch(0, stream)
    check_batch(batch, stream, 0, offsets)
    assert batch.end_offset == offsets[-1] + batch.sizes[-1]


@pytest.mark.parametrize("seed", range(8))
def test_boundaries_across_random_chunk_splits(seed: int) -> None:
    rnd = random.Random(seed)
    start = SEGMENT * 3 + rnd.choice([0, 0, 100])
    stream, offsets = random_stream(rnd, 80, start=start, blanks=False)
    cuts = sorted(rnd.sample(range(1, len(stream)), rnd.randrange(1, 40)))
    assembler = RecordAssembler(start)
    batch = feed_in_chunks(assembler, start, stream, cuts)
    check_batch(batch, stream, start, offsets)
    assert assembler.next_offset == start + len(stream)
    assert assembler.pending_bytes == 0


def test_a_split_at_every_byte_of_a_record_gives_the_same_records() -> None:
    stream, offsets = random_stream(random.Random(3), 6, blanks=False)
    for cut in range(1, len(stream)):
        batch = feed_in_chunks(RecordAssembler(0), 0, stream, [cut])
        check_batch(batch, stream, 0, offsets)


def test_blank_marker_ends_the_scan_and_the_next_segment_follows() -> None:
    stream, offsets = random_stream(random.Random(4), 200)
    assert len(stream) > 2 * SEGMENT  # several segments, so several blank markers
    batch = RecordAssembler(0).feed_batch(0, stream)
    check_batch(batch, stream, 0, offsets)
    cuts = [SEGMENT - 3, SEGMENT + 5, 2 * SEGMENT]
    check_batch(feed_in_chunks(RecordAssembler(0), 0, stream, cuts), stream, 0, offsets)


def test_scan_stops_before_what_it_does_not_take() -> None:
    """V2 magic (long topic) and IPv6 records are left to scan_record, one at a time."""
    v1 = make_record(0, b"a")
    v2 = make_record(len(v1), b"b", topic="T" * 200)
    six = make_record(len(v1) + len(v2), b"c", v6=True)
    stream = v1 + v2 + six
    out = BatchBuilder()
    scanner = ChunkScanner(1 << 20)
    assert scanner.scan(stream, 0, 0, out) == len(v1)
    assert scanner.scan(stream, len(v1), 0, out) == len(v1)  # V2: not taken
    assert scanner.scan(stream, len(v1) + len(v2), 0, out) == len(v1) + len(v2)  # IPv6
    batch = RecordAssembler(0).feed_batch(0, stream)
    check_batch(batch, stream, 0, [0, len(v1), len(v1) + len(v2)])


def test_torn_tail_is_kept_for_the_next_chunk() -> None:
    stream, offsets = random_stream(random.Random(5), 10, blanks=False)
    last = offsets[-1]
    assembler = RecordAssembler(0)
    batch = assembler.feed_batch(0, stream[: last + 50])
    check_batch(batch, stream, 0, offsets[:-1])
    assert assembler.next_offset == last
    assert assembler.pending_bytes == 50
    rest = assembler.feed_batch(last + 50, stream[last + 50 :])
    assert list(rest.offsets) == [last]


def smallest_record(offset: int) -> bytes:
    """91 bytes: no body, an empty topic, no properties (encode_record wants a topic)."""
    data = bytearray(make_record(offset, b"", topic="A", props={}))
    assert len(data) == 92 and data[88:90] == b"\x01A"
    del data[89]  # the topic byte
    data[88] = 0  # topic length
    struct.pack_into(">i", data, 0, 91)
    return bytes(data)


def test_a_record_of_exactly_91_bytes_at_the_chunk_end() -> None:
    """The walk reads 92 bytes; the smallest record at the very end goes per record."""
    first = make_record(0, b"x" * 10)
    stream = first + smallest_record(len(first))
    assert scan_record(stream, len(first), len(stream)).kind is ScanKind.RECORD
    batch = RecordAssembler(0).feed_batch(0, stream)
    check_batch(batch, stream, 0, [0, len(first)])
    twice = stream + smallest_record(len(stream))
    check_batch(RecordAssembler(0).feed_batch(0, twice), twice, 0, [0, len(first), len(stream)])


def corrupt(stream: bytes, pos: int, value: bytes) -> bytes:
    return stream[:pos] + value + stream[pos + len(value) :]


@pytest.mark.parametrize(
    ("what", "patch_at", "value", "reason"),
    [
        ("body CRC", 88 + 2, b"\xff", "body CRC mismatch"),
        ("physical offset", 28, struct.pack(">q", 12345), "physical_offset field"),
        ("magic", 4, b"\x00\x00\x00\x01", "bad magic"),
        ("properties length", -1, b"", "field lengths add up"),
        ("topic UTF-8", -2, b"", "topic is not UTF-8"),
    ],
)
def test_corruption_mid_chunk_raises_at_its_offset_with_the_records_before(
    what: str, patch_at: int, value: bytes, reason: str
) -> None:
    rnd = random.Random(6)
    stream, offsets = random_stream(rnd, 30, blanks=False)
    # a V1 IPv4 record in the middle: the batch scan meets it
    victim_index = next(
        i
        for i in range(10, 30)
        if scan_record(stream, offsets[i], len(stream)).sys_flag == 0
        and 0 < len(scan_record(stream, offsets[i], len(stream)).topic.encode()) < 128
        and struct.unpack_from(">i", stream, offsets[i] + 84)[0] >= 5  # body length
    )
    victim = offsets[victim_index]
    data = bytearray(stream)
    if patch_at >= 0:
        data[victim + patch_at : victim + patch_at + len(value)] = value
    elif patch_at == -1:  # props length one too small: the fields no longer add up
        props = properties_start(bytes(data), victim)
        length = struct.unpack_from(">H", data, props - 2)[0]
        struct.pack_into(">H", data, props - 2, length - 1)
    else:  # an invalid UTF-8 byte in the topic
        body_len = struct.unpack_from(">i", data, victim + 84)[0]
        data[victim + 88 + body_len + 1] = 0xFF
    with pytest.raises(TailCorruptionError, match=reason) as caught:
        RecordAssembler(0).feed_batch(0, bytes(data))
    assert caught.value.offset == victim
    assert caught.value.batch_before is not None
    assert list(caught.value.batch_before.offsets) == offsets[:victim_index]
    assert [r.offset for r in caught.value.records_before] == offsets[:victim_index]
    check_batch(caught.value.batch_before, stream, 0, offsets[:victim_index])


def test_crc_check_off_takes_a_bad_body() -> None:
    stream, offsets = random_stream(random.Random(7), 5, blanks=False)
    bad = corrupt(stream, offsets[2] + 88, b"\xfe")
    batch = RecordAssembler(0, check_crc=False).feed_batch(0, bad)
    assert list(batch.offsets) == offsets


def test_unwritten_zero_bytes_after_records_are_a_protocol_error() -> None:
    stream, offsets = random_stream(random.Random(8), 4, blanks=False)
    with pytest.raises(TailProtocolError) as caught:
        RecordAssembler(0).feed_batch(0, stream + bytes(200))
    assert caught.value.offset == len(stream)
    assert caught.value.batch_before is not None
    assert list(caught.value.batch_before.offsets) == offsets


def test_record_above_max_record_bytes_is_corruption() -> None:
    small = make_record(0, b"s")
    big = make_record(len(small), b"b" * 500)
    with pytest.raises(TailCorruptionError, match="max_record_bytes") as caught:
        RecordAssembler(0, max_record_bytes=400).feed_batch(0, small + big)
    assert caught.value.offset == len(small)


def test_feed_and_feed_batch_agree() -> None:
    stream, _ = random_stream(random.Random(9), 60)
    records = RecordAssembler(0).feed(0, stream)
    batch = RecordAssembler(0).feed_batch(0, stream)
    assert records == batch.records()
    again = RecordBatch.from_records(records)
    assert again.records() == records
    assert again.head(7).records() == records[:7]


def test_gc_paused_nests_and_restores() -> None:
    was = gc.isenabled()
    gc.enable()
    try:
        with gc_paused():
            assert not gc.isenabled()
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled()
        gc.disable()
        with gc_paused():
            pass
        assert not gc.isenabled()  # it was off before: it stays off
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()


def test_empty_batch() -> None:
    batch = RecordAssembler(0).feed_batch(0, b"")
    assert not batch
    assert len(batch) == 0
    assert batch.records() == []


class _PerRecordOnly(ChunkScanner):
    """Takes nothing: every unit goes through scan_record (the per-record path)."""

    def scan(
        self, buf: bytes, start: int, base_offset: int, out: BatchBuilder, end: int | None = None
    ) -> int:
        return start


def _outcome(
    assembler: RecordAssembler, chunks: list[tuple[int, bytes]]
) -> tuple[list[RecordAt], str, int]:
    got: list[RecordAt] = []
    for offset, data in chunks:
        try:
            got += assembler.feed_batch(offset, data).records()
        except (TailCorruptionError, TailProtocolError) as exc:
            got += exc.records_before
            return got, f"{type(exc).__name__}: {exc}", exc.offset
    return got, "", assembler.next_offset


@pytest.mark.parametrize("seed", range(40))
def test_random_damage_gives_what_the_per_record_path_gives(seed: int) -> None:
    """Bytes changed anywhere (sizes, magic, offsets, lengths, topics, bodies, markers),
    cut into random chunks: the same records, the same error at the same offset."""
    rnd = random.Random(seed)
    stream, _ = random_stream(rnd, 60)
    data = bytearray(stream)
    for _ in range(rnd.randrange(1, 4)):
        pos = rnd.randrange(len(data))
        data[pos] = rnd.randrange(256)
    if rnd.random() < 0.3:
        del data[rnd.randrange(len(data)) :]  # a torn tail
    cuts = sorted(rnd.sample(range(1, len(data)), min(len(data) - 1, rnd.randrange(0, 8))))
    bounds = [0, *cuts, len(data)]
    chunks = [(a, bytes(data[a:b])) for a, b in itertools.pairwise(bounds) if b > a]
    batch_way = RecordAssembler(0)
    per_record = RecordAssembler(0)
    per_record._scanner = _PerRecordOnly(per_record._max_record_bytes)
    assert _outcome(batch_way, chunks) == _outcome(per_record, chunks)


def test_runs_between_per_record_units_share_one_copy_of_the_chunk() -> None:
    """V1 runs split by V2 records: the batch holds the chunk once, not once per run."""
    parts: list[bytes] = []
    offsets: list[int] = []
    offset = 0
    for index in range(40):
        topic = "T" * 200 if index % 2 else "A"  # every other record has a V2 magic
        data = make_record(offset, b"b" * 50, topic=topic, queue_offset=index)
        parts.append(data)
        offsets.append(offset)
        offset += len(data)
    stream = b"".join(parts)
    batch = RecordAssembler(0).feed_batch(0, stream)
    check_batch(batch, stream, 0, offsets)
    assert len(batch.data) <= 2 * len(stream)  # the chunk once, plus the V2 records
