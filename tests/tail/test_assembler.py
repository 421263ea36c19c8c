"""RecordAssembler: Tail chunks in, whole checked records out (pure, no I/O)."""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import Sequence

import pytest

from tide.format import (
    BLANK_MARKER_BYTES,
    ScanKind,
    decode_record,
    encode_properties,
    encode_record,
    pack_host,
    parse_host,
    patch_record,
    write_blank,
)
from tide.tail import (
    DEFAULT_MAX_RECORD_BYTES,
    RecordAssembler,
    RecordAt,
    TailCorruptionError,
    TailProtocolError,
)

HOST = pack_host(parse_host("10.0.0.7:10911"))
SEGMENT = 1024  # segment size of the hand-made streams with a blank marker
BODY_POS_V4 = 88  # formats.md: the body follows 88 header bytes (IPv4 hosts)
PHYSICAL_OFFSET_POS = 28


def record(offset: int, body: bytes, *, topic: str = "TailTopic", queue_offset: int = 0) -> bytes:
    """A valid record as the store writes it at ``offset``."""
    encoded = encode_record(
        topic,
        topic.encode(),
        3,
        body,
        encode_properties({"TAGS": "t"}),
        0,
        0,
        1000,
        HOST,
        HOST,
    )
    data = bytearray(encoded.data)
    patch_record(data, 0, encoded.store_timestamp_pos, queue_offset, offset, 2000)
    return bytes(data)


def records_from(start: int, bodies: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """Records back to back from ``start``: their bytes and offsets."""
    parts: list[bytes] = []
    offsets: list[int] = []
    offset = start
    for index, body in enumerate(bodies):
        data = record(offset, body, queue_offset=index)
        parts.append(data)
        offsets.append(offset)
        offset += len(data)
    return b"".join(parts), offsets


def blank(size: int) -> bytes:
    data = bytearray(size)
    write_blank(data, 0, size)
    return bytes(data)


def feed_all(assembler: RecordAssembler, chunks: Sequence[tuple[int, bytes]]) -> list[RecordAt]:
    out: list[RecordAt] = []
    for offset, data in chunks:
        out.extend(assembler.feed(offset, data))
    return out


def chunked(start: int, data: bytes, cuts: Sequence[int]) -> list[tuple[int, bytes]]:
    """``data`` (at offset ``start``) cut at the given positions."""
    bounds = [0, *cuts, len(data)]
    return [(start + a, data[a:b]) for a, b in itertools.pairwise(bounds) if b > a]


def check_records(got: Sequence[RecordAt], stream: bytes, start: int, offsets: list[int]) -> None:
    assert [r.offset for r in got] == offsets
    for index, rec in enumerate(got):
        assert rec.scan.kind is ScanKind.RECORD
        assert rec.scan.physical_offset == rec.offset
        assert rec.scan.queue_offset == index
        assert rec.size == len(rec.data) == rec.scan.size
        assert rec.data == stream[rec.offset - start : rec.end_offset - start]
        decoded = decode_record(rec.data, 0, rec.size, expected_offset=rec.offset)
        assert decoded.topic == "TailTopic"


THREE, THREE_OFFSETS = records_from(0, [b"a" * 5, b"", b"ccc" * 7])


# -- splitting ---------------------------------------------------------------------
def test_one_chunk_gives_every_record() -> None:
    assembler = RecordAssembler(0)
    got = assembler.feed(0, THREE)
    check_records(got, THREE, 0, THREE_OFFSETS)
    assert assembler.next_offset == assembler.expected_offset == len(THREE)
    assert assembler.pending_bytes == 0


@pytest.mark.parametrize("cut", range(1, len(THREE)))
def test_a_split_at_any_byte_gives_the_same_records(cut: int) -> None:
    assembler = RecordAssembler(0)
    first = assembler.feed(0, THREE[:cut])
    complete = [o for o in THREE_OFFSETS if o in {r.offset for r in first}]
    assert [r.offset for r in first] == complete
    assert assembler.next_offset == max([0, *(r.end_offset for r in first)])
    assert assembler.pending_bytes == cut - assembler.next_offset
    second = assembler.feed(cut, THREE[cut:])
    check_records(first + second, THREE, 0, THREE_OFFSETS)
    assert assembler.next_offset == len(THREE)
    assert assembler.pending_bytes == 0


def test_byte_by_byte() -> None:
    start = 7_000_000
    stream, offsets = records_from(start, [b"x" * 300, b"y", b"z" * 40])
    assembler = RecordAssembler(start)
    got = feed_all(assembler, [(start + i, stream[i : i + 1]) for i in range(len(stream))])
    check_records(got, stream, start, offsets)
    assert assembler.next_offset == start + len(stream)


def test_random_chunkings_with_blank_markers() -> None:
    """Three segments, each ending with a blank marker, cut at random places."""
    rng = random.Random(7)
    stream = b""
    offsets: list[int] = []
    for segment in range(3):
        base = segment * SEGMENT
        data, offs = records_from(base, [bytes([65 + i]) * rng.randrange(0, 200) for i in range(3)])
        stream += data + blank(SEGMENT - len(data))
        offsets += offs
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randrange(1, 12)))
        assembler = RecordAssembler(0)
        got = feed_all(assembler, chunked(0, stream, cuts))
        assert [r.offset for r in got] == offsets
        assert all(r.data == stream[r.offset : r.end_offset] for r in got)
        assert assembler.next_offset == 3 * SEGMENT


# -- blank markers -----------------------------------------------------------------
def segment_with_blank() -> tuple[bytes, list[int], bytes, list[int]]:
    """Segment 0 (records + blank marker to SEGMENT) and the first records of segment 1."""
    first, first_offsets = records_from(0, [b"1" * 100, b"2" * 200])
    second, second_offsets = records_from(SEGMENT, [b"3" * 50, b"4"])
    return first + blank(SEGMENT - len(first)), first_offsets, second, second_offsets


def test_blank_marker_then_the_next_segment() -> None:
    segment0, offsets0, segment1, offsets1 = segment_with_blank()
    assembler = RecordAssembler(0)
    got = assembler.feed(0, segment0)
    assert [r.offset for r in got] == offsets0
    assert assembler.next_offset == SEGMENT
    got += assembler.feed(SEGMENT, segment1)
    assert [r.offset for r in got] == offsets0 + offsets1
    assert assembler.next_offset == SEGMENT + len(segment1)


def test_after_the_marker_head_the_next_chunk_may_start_at_the_next_segment() -> None:
    """The proto's contract: after a blank marker the stream resumes at the next segment
    (the filler need not be sent)."""
    segment0, offsets0, segment1, offsets1 = segment_with_blank()
    marker = offsets0[-1] + len(record(0, b"2" * 200))
    assembler = RecordAssembler(0)
    got = assembler.feed(0, segment0[: marker + BLANK_MARKER_BYTES])
    assert [r.offset for r in got] == offsets0
    assert assembler.next_offset == SEGMENT
    got += assembler.feed(SEGMENT, segment1)
    assert [r.offset for r in got] == offsets0 + offsets1


@pytest.mark.parametrize("cut", [1, 4, 7, 8, 9, 100])
def test_a_marker_split_anywhere_is_skipped(cut: int) -> None:
    """The storage service sends the filler too, cut wherever the chunk size says."""
    segment0, offsets0, segment1, offsets1 = segment_with_blank()
    marker = len(segment0) - (SEGMENT - (offsets0[-1] + len(record(0, b"2" * 200))))
    chunks = [*chunked(0, segment0, [marker + cut]), (SEGMENT, segment1)]
    assembler = RecordAssembler(0)
    got = feed_all(assembler, chunks)
    assert [r.offset for r in got] == offsets0 + offsets1


def test_an_8_byte_blank_marker() -> None:
    data, offsets = records_from(0, [b"q" * 10])
    size = len(data) + BLANK_MARKER_BYTES
    nxt, nxt_offsets = records_from(size, [b"r"])
    assembler = RecordAssembler(0)
    got = feed_all(assembler, [(0, data + blank(BLANK_MARKER_BYTES)), (size, nxt)])
    assert [r.offset for r in got] == offsets + nxt_offsets


def test_a_chunk_in_one_piece_across_the_segment_end() -> None:
    segment0, offsets0, segment1, offsets1 = segment_with_blank()
    got = RecordAssembler(0).feed(0, segment0 + segment1)
    assert [r.offset for r in got] == offsets0 + offsets1


@pytest.mark.parametrize("wrong", [SEGMENT - 1, SEGMENT + 1, SEGMENT + 91, 2 * SEGMENT])
def test_a_chunk_after_a_blank_marker_at_the_wrong_offset_raises(wrong: int) -> None:
    segment0, *_ = segment_with_blank()
    assembler = RecordAssembler(0)
    assembler.feed(0, segment0)
    with pytest.raises(TailProtocolError, match=f"chunk at offset {wrong}.*blank marker"):
        assembler.feed(wrong, b"\0" * 16)


@pytest.mark.parametrize("wrong", [1000, SEGMENT + 8])
def test_a_chunk_after_a_marker_head_at_the_wrong_offset_raises(wrong: int) -> None:
    segment0, offsets0, _, _ = segment_with_blank()
    marker = offsets0[-1] + len(record(0, b"2" * 200))
    assembler = RecordAssembler(0)
    assembler.feed(0, segment0[: marker + BLANK_MARKER_BYTES])
    with pytest.raises(TailProtocolError, match=f"expected the next segment at {SEGMENT}") as info:
        assembler.feed(wrong, b"\0" * 16)
    assert info.value.offset == wrong


@pytest.mark.parametrize("size", [0, 4, 7, DEFAULT_MAX_RECORD_BYTES + BLANK_MARKER_BYTES + 1])
def test_a_blank_marker_of_impossible_size_raises(size: int) -> None:
    head = struct.pack(">ii", size, -875286124)
    with pytest.raises(TailProtocolError, match=f"declares {size} bytes") as info:
        RecordAssembler(500).feed(500, head)
    assert info.value.offset == 500


# -- continuity --------------------------------------------------------------------
@pytest.mark.parametrize("delta", [-1, 1, -len(THREE), 4096])
def test_a_chunk_out_of_sequence_raises(delta: int) -> None:
    assembler = RecordAssembler(0)
    assembler.feed(0, THREE[:50])
    wrong = 50 + delta
    with pytest.raises(TailProtocolError, match=f"chunk at offset {wrong}, expected 50") as info:
        assembler.feed(wrong, THREE[50:])
    assert info.value.offset == wrong


def test_the_first_chunk_must_start_at_the_offset_asked_for() -> None:
    with pytest.raises(TailProtocolError, match="expected 100"):
        RecordAssembler(100).feed(0, THREE)


def test_empty_chunks_change_nothing() -> None:
    assembler = RecordAssembler(0)
    assert assembler.feed(0, b"") == []
    assembler.feed(0, THREE[:10])
    assert assembler.feed(10, b"") == []
    got = assembler.feed(10, THREE[10:])
    check_records(got, THREE, 0, THREE_OFFSETS)


# -- invalid bytes -----------------------------------------------------------------
def corrupt(stream: bytes, pos: int, value: bytes) -> bytes:
    return stream[:pos] + value + stream[pos + len(value) :]


def test_a_body_crc_mismatch_raises_with_the_offset() -> None:
    second = THREE_OFFSETS[1]
    third = THREE_OFFSETS[2]
    bad = corrupt(THREE, third + BODY_POS_V4, b"X")
    assembler = RecordAssembler(0)
    with pytest.raises(TailCorruptionError, match="CRC") as info:
        assembler.feed(0, bad)
    assert info.value.offset == third
    assert f"offset {third}" in str(info.value)
    # The records before it come with the error; next_offset is the bad record.
    assert [r.offset for r in info.value.records_before] == THREE_OFFSETS[:2]
    assert assembler.next_offset == third
    assert second in {r.offset for r in info.value.records_before}


def test_crc_check_can_be_turned_off() -> None:
    third = THREE_OFFSETS[2]
    bad = corrupt(THREE, third + BODY_POS_V4, b"X")
    got = RecordAssembler(0, check_crc=False).feed(0, bad)
    assert [r.offset for r in got] == THREE_OFFSETS


def test_a_record_that_does_not_name_its_own_offset_raises() -> None:
    second = THREE_OFFSETS[1]
    bad = corrupt(THREE, second + PHYSICAL_OFFSET_POS, struct.pack(">q", 12345))
    with pytest.raises(TailCorruptionError, match="physical_offset field 12345") as info:
        RecordAssembler(0).feed(0, bad)
    assert info.value.offset == second


def test_a_record_split_across_chunks_is_checked_too() -> None:
    second = THREE_OFFSETS[1]
    bad = corrupt(THREE, second + PHYSICAL_OFFSET_POS, struct.pack(">q", 1))
    assembler = RecordAssembler(0)
    assembler.feed(0, bad[: second + 20])
    with pytest.raises(TailCorruptionError) as info:
        assembler.feed(second + 20, bad[second + 20 :])
    assert info.value.offset == second


def test_bad_magic_raises() -> None:
    bad = corrupt(THREE, THREE_OFFSETS[1] + 4, b"\x12\x34\x56\x78")
    with pytest.raises(TailCorruptionError, match="bad magic 0x12345678") as info:
        RecordAssembler(0).feed(0, bad)
    assert info.value.offset == THREE_OFFSETS[1]


def test_unwritten_zero_bytes_are_a_protocol_error() -> None:
    assembler = RecordAssembler(0)
    assembler.feed(0, THREE)
    assert assembler.feed(len(THREE), b"\0" * 7) == []  # could still be a record head
    with pytest.raises(TailProtocolError, match=f"zero\\) bytes at offset {len(THREE)}"):
        assembler.feed(len(THREE) + 7, b"\0")


# -- resuming and bounds -------------------------------------------------------------
def test_next_offset_after_a_partial_record() -> None:
    start = 1 << 33
    stream, offsets = records_from(start, [b"p" * 1000, b"q" * 1000])
    cut = offsets[1] - start + 500
    assembler = RecordAssembler(start)
    got = assembler.feed(start, stream[:cut])
    assert [r.offset for r in got] == offsets[:1]
    assert assembler.next_offset == offsets[1]
    assert assembler.expected_offset == start + cut
    assert assembler.pending_bytes == 500
    # A new assembler from next_offset gets the rest when the bytes are sent again.
    again = RecordAssembler(assembler.next_offset)
    rest = again.feed(offsets[1], stream[offsets[1] - start :])
    assert [r.offset for r in rest] == offsets[1:]


def test_a_declared_size_above_max_record_bytes_raises_at_once() -> None:
    big = record(0, b"b" * 500)
    assembler = RecordAssembler(0, max_record_bytes=400)
    assert assembler.feed(0, big[:7]) == []
    with pytest.raises(TailCorruptionError, match=r"total_size \d+ outside \[91, 400\]") as info:
        assembler.feed(7, big[7:8])
    assert info.value.offset == 0
    assert assembler.pending_bytes <= 8


def test_a_huge_declared_size_never_buffers() -> None:
    head = struct.pack(">ii", 2**31 - 1, -626843481)
    with pytest.raises(TailCorruptionError, match=str(DEFAULT_MAX_RECORD_BYTES)):
        RecordAssembler(0).feed(0, head + b"\0" * 100)


def test_the_carry_over_stays_below_the_record_size() -> None:
    stream, _ = records_from(0, [b"m" * 5000])
    assembler = RecordAssembler(0, max_record_bytes=len(stream))
    for pos in range(0, len(stream) - 1, 100):
        assert assembler.feed(pos, stream[pos : min(pos + 100, len(stream) - 1)]) == []
        assert assembler.pending_bytes < len(stream)
    (got,) = assembler.feed(len(stream) - 1, stream[-1:])
    assert got.data == stream


def test_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="offset"):
        RecordAssembler(-1)
    with pytest.raises(ValueError, match="max_record_bytes"):
        RecordAssembler(0, max_record_bytes=90)
