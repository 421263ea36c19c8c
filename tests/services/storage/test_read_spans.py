"""``Storage.Read`` with ``spans`` (runs of whole records, returned as stored) against a
real storage process: the bytes equal the stored ones and decode to what the positions
form gives; per-span statuses (FOUND, NOT_A_RECORD, OFFSET_ABOVE_MAX, OFFSET_BELOW_MIN);
request checks; segment boundaries; the same over ReadStream. The segment-crossing reads
of services/storage/span_read.py are also checked on an engine-level store."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path

import grpc
import pytest

from services.storage import span_read
from services.storage.engine.message_store import MessageStore
from tests.services.storage.conftest import (
    RPC_TIMEOUT_S,
    SEGMENT_BYTES,
    StorageLauncher,
    StorageProcess,
    expect_error,
    message,
    segment_files,
)
from tests.services.storage.engine import _recovery_helpers as engine
from tests.services.storage.test_read_stream import check_as_unary, exchange
from tide.format import (
    BLANK_MAGIC,
    FIXED_BYTES_V4,
    MESSAGE_MAGIC_V2,
    QUEUE_OFFSET_POS,
    DecodedRecord,
    decode_record,
)
from tide.v1 import storage_pb2 as pb

Span = tuple[int, int, int]  # physical_offset, size, count


# -- helpers -------------------------------------------------------------------------
def span_of(results: Sequence[pb.AppendResult]) -> Span:
    """The span of consecutive appended records."""
    first, last = results[0], results[-1]
    return (
        first.physical_offset,
        last.physical_offset + last.size - first.physical_offset,
        len(results),
    )


def spans_request(*spans: Span) -> pb.ReadRequest:
    return pb.ReadRequest(
        spans=[pb.RecordSpan(physical_offset=o, size=s, count=c) for o, s, c in spans]
    )


def read_spans(storage: StorageProcess, *spans: Span) -> pb.ReadResponse:
    response = storage.stub.Read(spans_request(*spans), timeout=RPC_TIMEOUT_S)
    assert len(response.span_statuses) == len(spans), response
    assert not response.results
    return response


def status_of(storage: StorageProcess, span: Span) -> pb.ReadStatus.ValueType:
    response = read_spans(storage, span)
    if response.span_statuses[0] != pb.FOUND:
        assert response.records == b""
    return response.span_statuses[0]


def stored_bytes(store_dir: Path, offset: int, size: int) -> bytes:
    """The bytes in the segment file itself (a span never leaves its segment here)."""
    path = segment_files(store_dir)[offset // SEGMENT_BYTES]
    with path.open("rb") as file:
        file.seek(offset % SEGMENT_BYTES)
        return file.read(size)


def decode_all(data: bytes, offset: int) -> list[DecodedRecord]:
    """The records back to back in ``data``, stored from ``offset``."""
    records: list[DecodedRecord] = []
    pos = 0
    while pos < len(data):
        records.append(decode_record(data, pos, len(data), expected_offset=offset + pos))
        pos += records[-1].total_size
    assert pos == len(data)
    return records


def assert_same_message(record: DecodedRecord, stored: pb.StoredMessage) -> None:
    assert (record.topic, record.queue_id, record.body) == (
        stored.topic,
        stored.queue_id,
        stored.body,
    )
    assert (record.queue_offset, record.physical_offset, record.total_size) == (
        stored.queue_offset,
        stored.physical_offset,
        stored.size,
    )
    assert (record.body_crc, record.store_timestamp_ms, record.sys_flag, record.flag) == (
        stored.body_crc,
        stored.store_timestamp_ms,
        stored.sys_flag,
        stored.flag,
    )
    assert record.properties == dict(stored.properties)


def bodies(count: int, tag: str = "b") -> list[bytes]:
    """Bodies of varying sizes (records of varying sizes)."""
    return [f"{tag}{i}-".encode() * (i * 7 + 1) for i in range(count)]


# -- the bytes -----------------------------------------------------------------------
def test_a_batch_read_as_one_span_equals_the_positions_reads(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    messages = [
        message(topic_name, i % 3, body, tags=f"tag{i}", keys=[f"k{i}"], flag=i)
        for i, body in enumerate(bodies(10))
    ]
    results = shared_storage.append(messages)
    offset, size, count = span_of(results)
    response = read_spans(shared_storage, (offset, size, count))
    assert list(response.span_statuses) == [pb.FOUND]
    assert response.records == stored_bytes(shared_storage.store_dir, offset, size)
    read = shared_storage.read((r.physical_offset, r.size) for r in results)
    assert [r.status for r in read] == [pb.FOUND] * count
    records = decode_all(response.records, offset)
    assert len(records) == count
    for record, result, sent in zip(records, read, messages, strict=True):
        assert_same_message(record, result.message)
        assert record.body == sent.body


def test_several_spans_answer_in_order_with_records_only_for_found(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    results = shared_storage.append([message(topic_name, 0, b) for b in bodies(8)])
    max_offset = shared_storage.status().max_offset
    first, second = span_of(results[0:3]), span_of(results[5:6])
    spans = [
        first,
        (max_offset + 1000, 200, 1),  # not written yet
        (*span_of(results[3:5])[:2], 3),  # wrong count
        second,
        (results[6].physical_offset + 1, results[6].size, 1),  # not at a record start
        first,  # the same span twice: its bytes twice
    ]
    response = read_spans(shared_storage, *spans)
    assert list(response.span_statuses) == [
        pb.FOUND,
        pb.OFFSET_ABOVE_MAX,
        pb.NOT_A_RECORD,
        pb.FOUND,
        pb.NOT_A_RECORD,
        pb.FOUND,
    ]
    store_dir = shared_storage.store_dir
    first_bytes = stored_bytes(store_dir, first[0], first[1])
    assert response.records == first_bytes + stored_bytes(store_dir, *second[:2]) + first_bytes


# -- statuses ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("d_offset", "d_size", "d_count", "next_record"),
    [
        (0, 0, 1, False),
        (0, 0, -1, False),
        (0, -1, 0, False),
        (0, 1, 0, False),
        (0, 0, 0, True),
        (1, -1, 0, False),
        (28, -28, 0, False),
        (-1, 1, 0, False),
    ],
    ids=[
        "count one more",
        "count one less",
        "size one byte short",
        "size one byte over",
        "size of the next record too, same count",
        "offset one byte in",
        "offset at the physical offset field",
        "offset one byte before",
    ],
)
def test_a_span_that_is_not_exactly_its_records_is_not_a_record(
    shared_storage: StorageProcess,
    topic_name: str,
    d_offset: int,
    d_size: int,
    d_count: int,
    next_record: bool,
) -> None:
    results = shared_storage.append([message(topic_name, 0, b) for b in bodies(5)])
    offset, size, count = span_of(results[1:3])
    assert status_of(shared_storage, (offset, size, count)) == pb.FOUND
    if next_record:
        d_size += results[3].size
    span = (offset + d_offset, size + d_size, count + d_count)
    assert status_of(shared_storage, span) == pb.NOT_A_RECORD


def test_a_span_past_the_written_end_is_above_max(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    results = shared_storage.append([message(topic_name, 0, b) for b in bodies(3)])
    last = results[-1]
    max_offset = shared_storage.status().max_offset
    assert last.physical_offset + last.size == max_offset
    assert status_of(shared_storage, (last.physical_offset, last.size, 1)) == pb.FOUND
    for span in [
        (last.physical_offset, last.size + 100, 1),  # its end is not written yet
        (last.physical_offset, last.size + 100, 2),
        (max_offset, 100, 1),
        (max_offset + (5 << 30), 100, 1),  # past any segment
    ]:
        assert status_of(shared_storage, span) == pb.OFFSET_ABOVE_MAX, span


# -- request checks ------------------------------------------------------------------------
def test_positions_and_spans_together_are_invalid(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    results = shared_storage.append([message(topic_name)])
    offset, size, count = span_of(results)
    request = spans_request((offset, size, count))
    request.positions.add(physical_offset=offset, size=size)
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        partial(shared_storage.stub.Read, request, timeout=RPC_TIMEOUT_S),
        "a Read has positions or spans, not both",
    )


@pytest.mark.parametrize(
    "bad",
    [(0, 100, 0), (0, 100, -1), (0, 0, 1), (0, -5, 1), (-1, 100, 1)],
    ids=["count 0", "count -1", "size 0", "size -5", "offset -1"],
)
def test_malformed_spans_are_invalid_and_named(shared_storage: StorageProcess, bad: Span) -> None:
    request = spans_request((0, 100, 1), bad)
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        partial(shared_storage.stub.Read, request, timeout=RPC_TIMEOUT_S),
        "spans[1]",
    )


def test_span_limits(shared_storage: StorageProcess) -> None:
    read = shared_storage.stub.Read
    too_many_spans = spans_request(*[(0, 100, 1)] * 1025)
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        partial(read, too_many_spans, timeout=RPC_TIMEOUT_S),
        "spans has 1025 entries",
    )
    too_many_records = spans_request((0, 100_000, 1000), (100_000, 100_000, 25))
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        partial(read, too_many_records, timeout=RPC_TIMEOUT_S),
        "1025 records",
    )
    too_many_bytes = spans_request((0, 40 << 20, 1), (40 << 20, 30 << 20, 1))
    expect_error(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        partial(read, too_many_bytes, timeout=RPC_TIMEOUT_S),
        f"Read asks for {70 << 20} bytes",
    )
    at_the_limits = spans_request(*[(10 << 40, 64 << 10, 1)] * 1024)  # 64 MiB in all
    response = read(at_the_limits, timeout=RPC_TIMEOUT_S)
    assert list(response.span_statuses) == [pb.OFFSET_ABOVE_MAX] * 1024


# -- segment boundaries and retention ---------------------------------------------------------
def test_segment_boundaries_and_deleted_segments(launcher: StorageLauncher, tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    storage = launcher.start(store_dir)
    results: list[pb.AppendResult] = []
    for batch in range(4):
        sent = [message("Big", 0, bytes([batch * 10 + i]) * 60_000) for i in range(10)]
        results += storage.append(sent)
    last0 = [r for r in results if r.physical_offset < SEGMENT_BYTES][-1]
    index = results.index(last0)
    first1, second1 = results[index + 1], results[index + 2]
    assert first1.physical_offset == SEGMENT_BYTES  # the rest of segment 0 is filler
    filler = last0.physical_offset + last0.size
    assert filler < SEGMENT_BYTES
    across = span_of([last0, first1])
    assert across[1] > last0.size + first1.size
    statuses = {
        "the last record of a segment": status_of(storage, span_of([last0])),
        "into the next segment": status_of(storage, across),
        "into the next segment, filler counted": status_of(storage, (*across[:2], 3)),
        "to the segment end": status_of(
            storage, (last0.physical_offset, SEGMENT_BYTES - last0.physical_offset, 1)
        ),
        "the filler": status_of(storage, (filler, SEGMENT_BYTES - filler, 1)),
    }
    assert statuses == {
        "the last record of a segment": pb.FOUND,
        "into the next segment": pb.NOT_A_RECORD,
        "into the next segment, filler counted": pb.NOT_A_RECORD,
        "to the segment end": pb.NOT_A_RECORD,
        "the filler": pb.NOT_A_RECORD,
    }
    kept = span_of([first1, second1])
    kept_bytes = read_spans(storage, kept).records
    assert len(kept_bytes) == kept[1]

    storage.stop()
    segment_files(store_dir)[0].unlink()  # what retention does
    storage = launcher.start(store_dir)
    assert storage.status().min_offset == SEGMENT_BYTES
    response = read_spans(storage, span_of(results[:2]), span_of([last0]), across, kept)
    assert list(response.span_statuses) == [
        pb.OFFSET_BELOW_MIN,
        pb.OFFSET_BELOW_MIN,
        pb.OFFSET_BELOW_MIN,
        pb.FOUND,
    ]
    assert response.records == kept_bytes


# -- ReadStream ------------------------------------------------------------------------------
def test_spans_over_read_stream_answer_as_read(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    results = shared_storage.append([message(topic_name, 0, b) for b in bodies(6)])
    whole, head = span_of(results), span_of(results[:2])
    max_offset = shared_storage.status().max_offset
    good = [
        spans_request(whole),
        spans_request(head, (max_offset + 100, 50, 1), (head[0] + 1, head[1], 2), whole),
    ]
    both = spans_request(head)
    both.positions.add(physical_offset=head[0], size=results[0].size)
    bad = [both, spans_request(head, (0, 0, 1)), spans_request((0, 70 << 20, 1))]
    requests = [good[0], bad[0], bad[1], good[1], bad[2]]
    answers = asyncio.run(exchange(shared_storage, requests))
    check_as_unary(shared_storage, requests, answers, good)
    assert list(answers[0].response.span_statuses) == [pb.FOUND]
    assert list(answers[3].response.span_statuses) == [
        pb.FOUND,
        pb.OFFSET_ABOVE_MAX,
        pb.NOT_A_RECORD,
        pb.FOUND,
    ]
    whole_bytes = answers[0].response.records
    assert answers[3].response.records == whole_bytes[: head[1]] + whole_bytes


# -- span_read on an engine-level store --------------------------------------------------------
@pytest.fixture
def harness(tmp_path: Path) -> Iterator[engine.Harness]:
    h = engine.Harness(tmp_path / "store")
    yield h
    h.close_all()


def test_span_bytes_reads_one_piece_per_segment(harness: engine.Harness) -> None:
    store: MessageStore = harness.open()
    written = engine.fill_segments(store, 1)
    written += engine.put(store, [engine.message("Next", 0, b"x" * 500) for _ in range(2)])
    last0, first1 = written[-3], written[-2]
    assert first1.offset == engine.SEGMENT_BYTES
    start, end = last0.offset, first1.offset + first1.size
    pieces = span_read.span_bytes(store.commitlog, start, end - start)
    assert pieces is not None
    assert [len(p) for p in pieces] == [engine.SEGMENT_BYTES - start, first1.size]
    assert pieces[1] == store.commitlog.read_raw(first1.offset, first1.size)[1]
    assert not span_read.are_records(pieces, start, 2)  # the first piece ends in filler
    span = pb.RecordSpan(physical_offset=start, size=end - start, count=2)
    assert span_read.read_span(store.commitlog, span, []) == pb.NOT_A_RECORD
    assert span_read.span_bytes(store.commitlog, first1.offset, 10_000) is None


def test_are_records_across_pieces(harness: engine.Harness) -> None:
    """Records ending exactly at a piece end (a segment end) continue in the next piece;
    a record cut by a piece end is not a record."""
    store: MessageStore = harness.open()
    written = engine.put_many(store, 4)
    start = written[0].offset
    size = sum(w.size for w in written)
    pieces = span_read.span_bytes(store.commitlog, start, size)
    assert pieces is not None and len(pieces) == 1
    data = pieces[0]
    at_record = written[0].size + written[1].size
    assert span_read.are_records([data[:at_record], data[at_record:]], start, 4)
    assert span_read.are_records([data[:at_record], b"", data[at_record:]], start, 4)
    assert not span_read.are_records([data[:at_record], data[at_record:]], start, 3)
    assert not span_read.are_records([data[:at_record], data[at_record:]], start + 1, 4)
    cut = at_record + 40
    assert not span_read.are_records([data[:cut], data[cut:]], start, 4)


@pytest.mark.parametrize(
    ("field", "value", "is_record"),
    [
        ("total_size", FIXED_BYTES_V4 - 1, False),  # TOTALSIZE below the smallest record
        ("total_size", 1 << 20, False),  # TOTALSIZE past the piece's end
        ("magic", BLANK_MAGIC, False),
        ("magic", 0, False),
        ("magic", MESSAGE_MAGIC_V2, True),  # both message magics are records
        ("physical", 0, False),  # PHYSICALOFFSET not the record's position
    ],
)
def test_are_records_checks_each_header(
    harness: engine.Harness, field: str, value: int, is_record: bool
) -> None:
    """One header field of the second of three real records changed (no CRC check: the
    body is not looked at)."""
    store: MessageStore = harness.open()
    written = engine.put_many(store, 3)
    start, second = written[0].offset, written[1]
    pieces = span_read.span_bytes(store.commitlog, start, sum(w.size for w in written))
    assert pieces is not None and span_read.are_records(pieces, start, 3)
    data = bytearray(pieces[0])
    at = second.offset - start
    if field == "total_size":
        struct.pack_into(">i", data, at, value)
    elif field == "magic":
        struct.pack_into(">i", data, at + 4, value)
    else:
        struct.pack_into(">q", data, at + QUEUE_OFFSET_POS + 8, value)
    data[at + 100] ^= 0xFF  # a body byte: its CRC no longer matches, which is not checked
    assert span_read.are_records([bytes(data)], start, 3) is is_record


def test_below_the_min_offset_on_an_engine_store(harness: engine.Harness) -> None:
    store: MessageStore = harness.open()
    written = engine.fill_segments(store, 2)
    written += engine.put(store, [engine.message("Next", 0, b"y" * 300)])
    harness.ratio[0] = 0.86  # force: retention deletes the oldest segment
    store.retention.run_once()
    assert written[0].offset < store.segments.min_offset <= written[-1].offset
    gone = pb.RecordSpan(physical_offset=written[0].offset, size=written[0].size, count=1)
    last = written[-1]
    kept = pb.RecordSpan(physical_offset=last.offset, size=last.size, count=1)
    response = span_read.read_spans(store.commitlog, [gone, kept])
    assert list(response.span_statuses) == [pb.OFFSET_BELOW_MIN, pb.FOUND]
    assert decode_all(response.records, last.offset)[0].body == last.body
