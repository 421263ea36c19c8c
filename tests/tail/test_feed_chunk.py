"""RecordAssembler.feed_chunk (batches over the received buffer, no copy) against
feed_batch (one batch per chunk): the same records, errors and offsets, chunk bytes
taken only from within their bounds."""

from __future__ import annotations

import itertools
import random

import pytest

from tests.tail.test_batch import check_batch, make_record, random_stream
from tide.tail import RecordAssembler, RecordAt, RecordBatch, TailCorruptionError, TailError
from tide.tail._follower import parse_tail_chunk
from tide.v1 import storage_pb2 as pb


def _chunks(rnd: random.Random, data: bytes, most: int = 8) -> list[tuple[int, bytes]]:
    cuts = sorted(rnd.sample(range(1, len(data)), min(len(data) - 1, rnd.randrange(0, most))))
    bounds = [0, *cuts, len(data)]
    return [(a, data[a:b]) for a, b in itertools.pairwise(bounds) if b > a]


def _framed(rnd: random.Random, chunk: bytes) -> tuple[bytes, int, int]:
    """The chunk inside a bigger buffer, between junk that looks like records."""
    junk = random_stream(rnd, 2, blanks=False)[0]
    before = junk[: rnd.randrange(0, len(junk))]
    after = junk[: rnd.randrange(0, len(junk))]
    return before + chunk + after, len(before), len(before) + len(chunk)


def _outcome_batch(chunks: list[tuple[int, bytes]]) -> tuple[list[RecordAt], str, int]:
    assembler = RecordAssembler(0)
    got: list[RecordAt] = []
    for offset, data in chunks:
        try:
            got += assembler.feed_batch(offset, data).records()
        except TailError as exc:
            return [*got, *exc.records_before], f"{type(exc).__name__}: {exc}", exc.offset
    return got, "", assembler.next_offset


def _outcome_chunk(
    rnd: random.Random, chunks: list[tuple[int, bytes]]
) -> tuple[list[RecordAt], str, int]:
    assembler = RecordAssembler(0)
    got: list[RecordAt] = []
    for offset, data in chunks:
        buf, start, stop = _framed(rnd, data)
        try:
            batches = assembler.feed_chunk(offset, buf, start, stop)
        except TailError as exc:
            return [*got, *exc.records_before], f"{type(exc).__name__}: {exc}", exc.offset
        assert len(batches) <= 2 and all(batches)
        for batch in batches:
            got += batch.records()
    return got, "", assembler.next_offset


@pytest.mark.parametrize("seed", range(30))
def test_feed_chunk_gives_what_feed_batch_gives(seed: int) -> None:
    rnd = random.Random(seed)
    stream, offsets = random_stream(rnd, 50)
    chunks = _chunks(rnd, stream, most=12)
    got, error, next_offset = _outcome_chunk(rnd, chunks)
    assert (got, error, next_offset) == _outcome_batch(chunks)
    assert error == ""
    check_batch(RecordBatch.from_records(got), stream, 0, offsets)


@pytest.mark.parametrize("seed", range(30))
def test_feed_chunk_on_damaged_streams_gives_what_feed_batch_gives(seed: int) -> None:
    """Changed bytes and torn tails: the same records, the same error at the same offset."""
    rnd = random.Random(100 + seed)
    data = bytearray(random_stream(rnd, 40)[0])
    for _ in range(rnd.randrange(1, 4)):
        data[rnd.randrange(len(data))] = rnd.randrange(256)
    if rnd.random() < 0.3:
        del data[rnd.randrange(len(data)) :]
    chunks = _chunks(rnd, bytes(data))
    assert _outcome_chunk(rnd, chunks) == _outcome_batch(chunks)


def _v1_stream(count: int) -> tuple[bytes, list[int]]:
    """Records the chunk scan takes (V1 magic, IPv4 hosts), of various sizes."""
    parts: list[bytes] = []
    offsets: list[int] = []
    offset = 0
    for index in range(count):
        data = make_record(offset, b"b" * (index * 7 % 300), queue_offset=index)
        parts.append(data)
        offsets.append(offset)
        offset += len(data)
    return b"".join(parts), offsets


def test_a_carried_record_comes_as_a_batch_of_its_own_and_the_rest_is_not_copied() -> None:
    stream, offsets = _v1_stream(30)
    cut = offsets[10] + 50  # inside record 10
    assembler = RecordAssembler(0)
    (first,) = assembler.feed_chunk(0, stream, 0, cut)
    assert list(first.offsets) == offsets[:10] and first.data is stream
    carried, rest = assembler.feed_chunk(cut, stream, cut)
    assert list(carried.offsets) == offsets[10:11]
    assert list(rest.offsets) == offsets[11:] and rest.data is stream
    check_batch(
        RecordBatch.from_records([*first.records(), *carried.records(), *rest.records()]),
        stream,
        0,
        offsets,
    )


def test_a_record_split_over_three_chunks_and_empty_chunks() -> None:
    stream, offsets = _v1_stream(3)
    assembler = RecordAssembler(0)
    assert assembler.feed_chunk(0, stream, 0, 0) == []
    assert assembler.feed_chunk(0, stream, 0, 10) == []
    assert assembler.feed_chunk(10, stream, 10, 20) == []
    batches = assembler.feed_chunk(20, stream, 20)
    assert [list(b.offsets) for b in batches] == [offsets[:1], offsets[1:]]


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="outside"):
        RecordAssembler(0).feed_chunk(0, b"abc", 2, 1)
    with pytest.raises(ValueError, match="outside"):
        RecordAssembler(0).feed_chunk(0, b"abc", 0, 4)


def test_corruption_after_a_carried_record_keeps_the_records_before() -> None:
    rnd = random.Random(6)
    stream, offsets = random_stream(rnd, 12, blanks=False)
    data = bytearray(stream)
    data[offsets[8] + 4] ^= 0xFF  # record 8's magic
    assembler = RecordAssembler(0)
    assembler.feed_chunk(0, bytes(data), 0, offsets[3] + 7)
    with pytest.raises(TailCorruptionError) as info:
        assembler.feed_chunk(offsets[3] + 7, bytes(data), offsets[3] + 7)
    assert info.value.offset == offsets[8]
    assert [r.offset for r in info.value.records_before] == offsets[3:8]


def test_parse_tail_chunk_says_where_the_data_starts() -> None:
    raw = pb.TailChunk(offset=7, data=b"records", max_offset=99).SerializeToString()
    chunk = parse_tail_chunk(raw)
    assert chunk.raw is raw
    assert raw[chunk.start : chunk.start + len(chunk.data)] == b"records"
