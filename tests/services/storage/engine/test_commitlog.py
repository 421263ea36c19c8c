"""Appending through MessageStore.put: the bytes on disk follow docs/formats.md."""

from __future__ import annotations

import ipaddress
import itertools
import struct
import time
import zlib
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from services.storage.engine.message_store import MessageStore
from services.storage.engine.system_topics import KEPT_TOPICS
from tests.services.storage.engine.conftest import (
    BLANK_BYTES,
    BLANK_MAGIC,
    FIXED_RECORD_BYTES_V4,
    MAX_BODY_BYTES,
    SEGMENT_BYTES,
    Position,
    StoreFactory,
    fill_segment,
    msg,
    msg_of_size,
    read_records,
    segment_path,
)
from tide.format import HostAddress, decode_record, make_msg_id, parse_msg_id
from tide.waiting import wait_until

MAGIC_V1 = 0xDAA320A7
SYSFLAG_PREPARED = 1 << 2
SYSFLAG_COMMIT = 2 << 2
SYSFLAG_ROLLBACK = 3 << 2
SYSFLAG_BORN_V6 = 1 << 4
SYSFLAG_STORE_V6 = 1 << 5

SYSTEM_TOPIC_COUNT = len(KEPT_TOPICS)  # the schedule, timer, transaction and revive topics


def packed_host(ip: str, port: int) -> bytes:
    return ipaddress.ip_address(ip).packed + struct.pack(">i", port)


def parse_properties(data: bytes) -> dict[str, str]:
    """An independent reader of ``name \\x01 value \\x02`` repeated."""
    assert data.endswith(b"\x02"), data
    result = {}
    for item in data[:-1].split(b"\x02"):
        name, sep, value = item.partition(b"\x01")
        assert sep, item
        result[name.decode()] = value.decode()
    return result


def raw_record(store: MessageStore, position: Position) -> bytes:
    offset, size, _ = position
    got_offset, data = store.commitlog.read_raw(offset, size)
    assert got_offset == offset
    assert len(data) == size
    return data


def file_bytes(store_dir: Path, offset: int, size: int) -> bytes:
    start = offset - offset % SEGMENT_BYTES
    with segment_path(store_dir, start).open("rb") as f:
        f.seek(offset - start)
        return f.read(size)


def blank_at(store_dir: Path, offset: int) -> tuple[int, int]:
    total_size, magic = struct.unpack(">ii", file_bytes(store_dir, offset, BLANK_BYTES))
    return total_size, magic


# -- record layout -----------------------------------------------------------------


def test_record_decodes_back_byte_exact(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store()
    store.put([msg("Warmup", 1, b"first")])  # so the record under test is not at offset 0
    body = bytes(range(256)) * 3
    message = msg(
        "TopicA",
        2,
        body,
        tags="TagA",
        keys=["k1", "k2"],
        properties={"p": "v\u00e9", "UNIQ_KEY": "C0A8000100002A9F0000000000000001"},
        flag=-7,
        born_timestamp_ms=1_700_000_000_123,
        born_host="10.1.2.3:5555",
        reconsume_times=3,
        prepared_transaction_offset=99,
    )
    before_ms = time.time_ns() // 1_000_000
    result = store.put([message])
    after_ms = time.time_ns() // 1_000_000
    assert result.durable is None  # ASYNC flush: nothing to wait for
    [position] = result.batch.positions
    offset, size, queue_offset = position
    assert offset == store.put([]).batch.end_offset - size  # nothing appended since
    assert queue_offset == 0
    raw = raw_record(store, position)

    record = decode_record(raw, 0, len(raw), expected_offset=offset)
    expected_props = {
        "p": "v\u00e9",
        "UNIQ_KEY": "C0A8000100002A9F0000000000000001",
        "TAGS": "TagA",
        "KEYS": "k1 k2",
    }
    assert record.total_size == size == len(raw)
    assert record.magic == MAGIC_V1 - (1 << 32)
    assert record.body_crc == zlib.crc32(body)
    assert record.queue_id == 2
    assert record.flag == -7
    assert record.queue_offset == 0
    assert record.physical_offset == offset
    assert record.sys_flag == 0
    assert record.born_timestamp_ms == 1_700_000_000_123
    assert record.born_host == HostAddress("10.1.2.3", 5555)
    assert record.store_timestamp_ms == result.batch.store_timestamp_ms
    assert before_ms <= record.store_timestamp_ms <= after_ms
    assert record.store_host == HostAddress("127.0.0.1", 10911)
    assert record.reconsume_times == 3
    assert record.prepared_transaction_offset == 99
    assert record.body == body
    assert record.topic == "TopicA"
    assert record.properties == expected_props

    # Byte for byte, built independently from formats.md (IPv4 hosts, v1 magic).
    props_pos = 88 + len(body) + 1 + len(b"TopicA")
    (props_len,) = struct.unpack_from(">H", raw, props_pos)
    props = raw[props_pos + 2 :]
    assert len(props) == props_len
    assert parse_properties(props) == expected_props
    assert size == FIXED_RECORD_BYTES_V4 + len(body) + len(b"TopicA") + props_len
    expected = (
        struct.pack(
            ">iIIiiqqiq",
            size,
            MAGIC_V1,
            zlib.crc32(body),
            2,
            -7,
            0,
            offset,
            0,
            1_700_000_000_123,
        )
        + packed_host("10.1.2.3", 5555)
        + struct.pack(">q", result.batch.store_timestamp_ms)
        + packed_host("127.0.0.1", 10911)
        + struct.pack(">iqi", 3, 99, len(body))
        + body
        + bytes([len(b"TopicA")])
        + b"TopicA"
        + struct.pack(">H", props_len)
        + props
    )
    assert raw == expected
    # What readers get is what is in the file.
    assert file_bytes(store_dir, offset, size) == raw
    assert store.commitlog.read_record(offset, size) == record


def test_defaults_born_timestamp_and_born_host(make_store: StoreFactory) -> None:
    store = make_store()
    before_ms = time.time_ns() // 1_000_000
    plain = store.put([msg()]).batch.positions[0]
    given = store.put([msg()], default_born_host="10.9.8.7:4321").batch.positions[0]
    after_ms = time.time_ns() // 1_000_000
    plain_record = store.commitlog.read_record(plain[0], plain[1])
    given_record = store.commitlog.read_record(given[0], given[1])
    # No born host: the caller's default, else the store's own address.
    assert plain_record.born_host == HostAddress("127.0.0.1", 10911)
    assert given_record.born_host == HostAddress("10.9.8.7", 4321)
    for record in (plain_record, given_record):
        assert before_ms <= record.born_timestamp_ms <= after_ms
        assert record.properties == {}
        assert record.total_size == FIXED_RECORD_BYTES_V4 + len(b"body") + len(b"T")


def test_queue_offsets_are_per_topic_and_queue_and_consecutive(make_store: StoreFactory) -> None:
    store = make_store()
    keys = [("A", 0), ("A", 1), ("B", 0), ("A", 0), ("B", 3), ("A", 0), ("B", 0)]
    positions: list[Position] = []
    # One batch with several queues, then single puts.
    batch = store.put([msg(t, q, f"{t}{q}-{i}".encode()) for i, (t, q) in enumerate(keys)])
    positions += batch.batch.positions
    for i, (t, q) in enumerate(keys, start=len(keys)):
        positions += store.put([msg(t, q, f"{t}{q}-{i}".encode())]).batch.positions
    all_keys = keys + keys
    seen: dict[tuple[str, int], list[int]] = defaultdict(list)
    for (topic, queue_id), position in zip(all_keys, positions, strict=True):
        seen[(topic, queue_id)].append(position[2])
        record = store.commitlog.read_record(position[0], position[1])
        assert (record.topic, record.queue_id, record.queue_offset) == (
            topic,
            queue_id,
            position[2],
        )
    for key, offsets in seen.items():
        assert offsets == list(range(len(offsets))), key
    assert store.commitlog.offsets.next_offsets == {k: len(v) for k, v in seen.items()}
    # Physical offsets are back to back.
    for prev, cur in itertools.pairwise(positions):
        assert cur[0] == prev[0] + prev[1]


def test_put_returns_put_batch_positions_in_request_order(make_store: StoreFactory) -> None:
    store = make_store()
    bodies = [b"x" * n for n in (1, 50, 7, 300)]
    batch = store.put([msg(body=b) for b in bodies]).batch
    assert [size for _, size, _ in batch.positions] == [
        FIXED_RECORD_BYTES_V4 + 1 + len(b) for b in bodies
    ]
    assert batch.positions[0][0] == 0
    assert batch.end_offset == sum(size for _, size, _ in batch.positions)
    assert [r.body for r in read_records(store)] == bodies


def test_concurrent_putters_get_unique_ordered_offsets(make_store: StoreFactory) -> None:
    store = make_store()
    threads, puts = 8, 100

    def putter(n: int) -> list[Position]:
        positions: list[Position] = []
        for i in range(puts):
            batch = [msg("Shared", 0, b"%d" % n * (i % 50 + 1)), msg(f"Own{n}", 1, b"o")]
            positions += store.put(batch[: 1 + i % 2]).batch.positions
        return positions

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(putter, range(threads)))
    every = sorted(p for positions in results for p in positions)
    # Back to back, no overlap, across the segment ends.
    assert every[0][0] == 0
    for prev, cur in itertools.pairwise(every):
        assert cur[0] == prev[0] + prev[1] or cur[0] % SEGMENT_BYTES == 0, (prev, cur)
    records = read_records(store)
    assert [r.physical_offset for r in records] == [p[0] for p in every]
    shared = [r.queue_offset for r in records if r.topic == "Shared"]
    assert shared == list(range(threads * puts))  # assigned in physical order, no gaps
    for n in range(threads):
        own = [r.queue_offset for r in records if r.topic == f"Own{n}"]
        assert own == list(range(puts // 2))


def test_transaction_prepared_and_rollback_take_no_queue_offset(make_store: StoreFactory) -> None:
    store = make_store()
    flags = [0, SYSFLAG_PREPARED, SYSFLAG_ROLLBACK, SYSFLAG_COMMIT, SYSFLAG_PREPARED, 0]
    batch = store.put([msg(body=b"%d" % i, sys_flag=f) for i, f in enumerate(flags)]).batch
    assert [q for _, _, q in batch.positions] == [0, 0, 0, 1, 0, 2]
    records = read_records(store)
    assert [r.sys_flag for r in records] == flags
    assert [r.queue_offset for r in records] == [0, 0, 0, 1, 0, 2]
    assert store.commitlog.offsets.next_offsets == {("T", 0): 3}
    # Queue-less records only: the queue does not move.
    only = store.put([msg(sys_flag=SYSFLAG_PREPARED), msg(sys_flag=SYSFLAG_ROLLBACK)]).batch
    assert [q for _, _, q in only.positions] == [0, 0]
    assert store.put([msg()]).batch.positions[0][2] == 3


def test_store_timestamps_never_decrease(make_store: StoreFactory) -> None:
    ticks = [5_000, 4_000, 3_000, 6_000, 5_999, 7_000]

    def clock_ms() -> int:  # goes backwards, then stays at its last value
        return ticks.pop(0) if len(ticks) > 1 else ticks[0]

    store = make_store(clock_ms=clock_ms)
    stamps = [store.put([msg(), msg()]).batch.store_timestamp_ms for _ in range(6)]
    assert stamps == [5_000, 5_000, 5_000, 6_000, 6_000, 7_000]
    records = read_records(store)
    assert [r.store_timestamp_ms for r in records] == [s for s in stamps for _ in range(2)]
    assert store.commitlog.last_store_timestamp_ms == 7_000


def test_store_timestamps_follow_the_wall_clock(make_store: StoreFactory) -> None:
    store = make_store()
    before_ms = time.time_ns() // 1_000_000
    stamps = [store.put([msg()]).batch.store_timestamp_ms for _ in range(200)]
    after_ms = time.time_ns() // 1_000_000
    assert stamps == sorted(stamps)
    assert before_ms <= stamps[0] and stamps[-1] <= after_ms


def test_empty_batch_appends_nothing(make_store: StoreFactory) -> None:
    store = make_store()
    store.put([msg()])
    before = store.status()
    result = store.put([])
    assert result.batch.positions == []
    assert result.batch.end_offset == before.max_offset
    assert result.durable is None
    assert store.status() == before


# -- segment ends --------------------------------------------------------------------


def test_record_that_exactly_fills_a_segment(make_store: StoreFactory, store_dir: Path) -> None:
    """A record goes in when ``size + 8 <= bytes_left``; it may end 8 bytes before the
    end, and the next record rolls, leaving an 8-byte blank marker."""
    store = make_store()
    fill_segment(store, leave_bytes=MAX_BODY_BYTES // 2 + BLANK_BYTES)
    left = SEGMENT_BYTES - store.status().max_offset
    last = store.put([msg_of_size(left - BLANK_BYTES, queue_id=1)]).batch.positions[0]
    assert last[0] + last[1] == SEGMENT_BYTES - BLANK_BYTES  # stayed in segment 0
    assert store.status().max_offset == SEGMENT_BYTES - BLANK_BYTES
    assert store.status().segment_count == 1
    assert store.commitlog.read_record(last[0], last[1]).queue_offset == 0

    rolled = store.put([msg(queue_id=1, body=b"next")]).batch.positions[0]
    assert rolled[0] == SEGMENT_BYTES
    assert rolled[2] == 1  # the blank takes no queue offset
    assert blank_at(store_dir, SEGMENT_BYTES - BLANK_BYTES) == (BLANK_BYTES, BLANK_MAGIC)
    assert store.status().max_offset == SEGMENT_BYTES + rolled[1]
    assert store.status().segment_count == 2
    record = store.commitlog.read_record(rolled[0], rolled[1])
    assert (record.physical_offset, record.body) == (SEGMENT_BYTES, b"next")


def test_blank_marker_and_roll_to_next_segment(make_store: StoreFactory, store_dir: Path) -> None:
    """A record that needs one byte more than ``bytes_left - 8`` rolls; the blank
    marker's total_size is all the bytes left."""
    store = make_store()
    size = 1000
    fill_segment(store, leave_bytes=size + BLANK_BYTES - 1)
    end = store.status().max_offset
    rolled = store.put([msg_of_size(size), msg_of_size(size)]).batch.positions
    assert rolled[0][0] == SEGMENT_BYTES
    assert rolled[1][0] == SEGMENT_BYTES + size
    assert blank_at(store_dir, end) == (SEGMENT_BYTES - end, BLANK_MAGIC)
    assert SEGMENT_BYTES - end == size + BLANK_BYTES - 1
    # Queue offsets go on across the roll; everything reads back in order.
    records = read_records(store)
    assert [r.queue_offset for r in records] == list(range(len(records)))
    assert records[-2].physical_offset == SEGMENT_BYTES
    # read_raw never crosses a segment end: from the blank it gives the blank's bytes.
    offset, data = store.commitlog.read_raw(end, 1 << 20)
    marker = struct.pack(">ii", SEGMENT_BYTES - end, BLANK_MAGIC)
    assert (offset, data) == (end, marker + bytes(SEGMENT_BYTES - end - BLANK_BYTES))


def test_batch_spanning_several_segments(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store()
    first = store.put([msg(queue_id=2, body=b"before")]).batch.positions[0]
    record_size = 50_000
    per_segment = (SEGMENT_BYTES - BLANK_BYTES) // record_size
    count = 4 * per_segment
    batch = store.put([msg_of_size(record_size, queue_id=2) for _ in range(count)]).batch
    # Queue offsets continue from before the batch, without a gap.
    assert [q for _, _, q in batch.positions] == list(range(1, count + 1))
    # No record spans a segment, each segment but the last ends with a blank marker.
    starts = sorted({offset - offset % SEGMENT_BYTES for offset, _, _ in batch.positions})
    assert len(starts) >= 3
    assert starts == [i * SEGMENT_BYTES for i in range(len(starts))]
    for offset, size, _ in batch.positions:
        assert offset // SEGMENT_BYTES == (offset + size - 1) // SEGMENT_BYTES
    status = store.status()
    assert status.segment_count == len(starts)
    assert status.max_offset == batch.end_offset
    assert batch.end_offset == batch.positions[-1][0] + record_size
    for start in starts[:-1]:
        seg_positions = [p for p in batch.positions if start <= p[0] < start + SEGMENT_BYTES]
        end = max(p[0] + p[1] for p in seg_positions)
        assert blank_at(store_dir, end) == (start + SEGMENT_BYTES - end, BLANK_MAGIC)
    for start in starts:
        assert segment_path(store_dir, start).stat().st_size == SEGMENT_BYTES
    records = read_records(store)
    assert [r.physical_offset for r in records] == [first[0]] + [p[0] for p in batch.positions]
    assert [r.queue_offset for r in records] == list(range(count + 1))


def test_zero_filled_preallocated_tail(make_store: StoreFactory, store_dir: Path) -> None:
    store = make_store()
    store.put([msg(body=b"\xff" * 5000, keys=["k"]) for _ in range(3)])
    end = store.status().max_offset
    data = segment_path(store_dir, 0).read_bytes()
    assert len(data) == SEGMENT_BYTES
    assert data[end - 1] != 0  # the last property separator
    assert not any(data[end:])
    # The segment created ahead is all zeros too.
    ahead = segment_path(store_dir, SEGMENT_BYTES)
    wait_until(ahead.exists, "the next segment to be created ahead")
    assert ahead.read_bytes() == bytes(SEGMENT_BYTES)


def test_empty_store_status(make_store: StoreFactory) -> None:
    store = make_store()
    status = store.status()
    assert (status.min_offset, status.max_offset) == (0, 0)
    assert (status.committed_offset, status.flushed_offset) == (0, 0)
    assert status.segment_count == 1  # prepared at open, empty
    assert status.writable
    assert status.topic_count == SYSTEM_TOPIC_COUNT == 5
    assert status.disk_usage_ratio == 0.10
    assert store.commitlog.read_raw(0, 4096) == (0, b"")

    position = store.put([msg()]).batch.positions[0]
    status = store.status()
    assert (status.min_offset, status.max_offset) == (0, position[1])
    assert status.committed_offset == position[1]
    assert status.segment_count == 1
    assert status.topic_count == SYSTEM_TOPIC_COUNT + 1


# -- message ids and hosts -------------------------------------------------------------


def test_msg_id_decodes_to_store_host_and_offset(make_store: StoreFactory) -> None:
    store = make_store(store_host="192.168.7.9:10922")
    positions = store.put([msg(body=b"a"), msg(body=b"b")]).batch.positions
    assert positions[1][0] > 0
    for offset, size, _ in positions:
        msg_id = make_msg_id(store.msg_id_prefix, offset)
        assert len(msg_id) == 32
        assert (
            msg_id == (packed_host("192.168.7.9", 10922) + struct.pack(">q", offset)).hex().upper()
        )
        host, parsed_offset = parse_msg_id(msg_id)
        assert (host, parsed_offset) == (HostAddress("192.168.7.9", 10922), offset)
        record = store.commitlog.read_record(parsed_offset, size)  # lookup by id: one read
        assert record.store_host == host


def test_ipv6_store_host_sets_sys_flag_bits_and_lengths(make_store: StoreFactory) -> None:
    store = make_store(store_host="[2001:db8::7]:10911")
    store_host = HostAddress("2001:db8::7", 10911)
    batch = store.put(
        [
            msg(body=b"v4 born", born_host="10.0.0.1:1"),
            msg(body=b"default born"),
            msg(body=b"v6 born", born_host="[::1]:2", tags="t"),
        ]
    ).batch
    expected = [
        (SYSFLAG_STORE_V6, HostAddress("10.0.0.1", 1), 12),
        (SYSFLAG_STORE_V6 | SYSFLAG_BORN_V6, store_host, 24),
        (SYSFLAG_STORE_V6 | SYSFLAG_BORN_V6, HostAddress("::1", 2), 24),
    ]
    props = [0, 0, len(b"TAGS\x01t\x02")]
    for position, (flags, born, extra), props_len in zip(
        batch.positions, expected, props, strict=True
    ):
        raw = raw_record(store, position)
        record = decode_record(raw, 0, len(raw), expected_offset=position[0])
        assert record.sys_flag == flags
        assert record.born_host == born
        assert record.store_host == store_host
        assert record.store_timestamp_ms == batch.store_timestamp_ms
        assert position[1] == FIXED_RECORD_BYTES_V4 + extra + len(record.body) + 1 + props_len
        # Layout: born host at 48, store timestamp after it, then the store host.
        born_len = 20 if flags & SYSFLAG_BORN_V6 else 8
        assert raw[48 : 48 + born_len] == packed_host(born.ip, born.port)
        (stamp,) = struct.unpack_from(">q", raw, 48 + born_len)
        assert stamp == batch.store_timestamp_ms
        store_pos = 56 + born_len
        assert raw[store_pos : store_pos + 20] == packed_host("2001:db8::7", 10911)
        msg_id = make_msg_id(store.msg_id_prefix, position[0])
        assert len(msg_id) == 56
        assert parse_msg_id(msg_id) == (store_host, position[0])


def test_ipv6_born_host_with_ipv4_store(make_store: StoreFactory) -> None:
    store = make_store()
    batch = store.put(
        [msg(born_host="[fe80::1]:7"), msg()], default_born_host="[2001:db8::1]:8"
    ).batch
    records = read_records(store)
    assert [r.sys_flag for r in records] == [SYSFLAG_BORN_V6, SYSFLAG_BORN_V6]
    assert [r.born_host for r in records] == [
        HostAddress("fe80::1", 7),
        HostAddress("2001:db8::1", 8),
    ]
    assert all(r.store_host == HostAddress("127.0.0.1", 10911) for r in records)
    assert [size for _, size, _ in batch.positions] == [FIXED_RECORD_BYTES_V4 + 12 + 4 + 1] * 2
    assert all(r.store_timestamp_ms == batch.store_timestamp_ms for r in records)


def test_read_tail_ends_a_segment_with_its_blank_marker(make_store: StoreFactory) -> None:
    """Tail never sends the filler after a blank marker: the marker's 8 bytes end the
    segment's data, and an offset inside the filler continues at the next segment."""
    store = make_store()
    fill_segment(store, leave_bytes=500)
    blank_at = store.status().max_offset
    (next_record,) = store.put([msg_of_size(1_000)]).batch.positions  # rolls
    assert next_record[0] == SEGMENT_BYTES
    commitlog = store.commitlog

    offset, data = commitlog.read_tail(blank_at - 100, 64 * 1024)
    assert offset == blank_at - 100 and len(data) == 100 + BLANK_BYTES
    assert struct.unpack_from(">ii", data, 100) == (500, BLANK_MAGIC)
    for inside_filler in (blank_at + BLANK_BYTES, SEGMENT_BYTES - 1):
        offset, data = commitlog.read_tail(inside_filler, 64 * 1024)
        assert offset == SEGMENT_BYTES and len(data) == next_record[1]
    # read_raw keeps the file's bytes, filler included.
    offset, data = commitlog.read_raw(blank_at, 64 * 1024)
    assert (offset, len(data)) == (blank_at, 500)


def test_read_tail_framed_is_read_tail_between_the_frame(make_store: StoreFactory) -> None:
    """The framed read gives read_tail's chunk (across a blank marker and its filler,
    and at the end: no data) between the frame's bytes for that chunk."""
    store = make_store()
    fill_segment(store, leave_bytes=500)
    blank_at = store.status().max_offset
    store.put([msg_of_size(1_000)])  # rolls
    end = store.status().max_offset
    commitlog = store.commitlog
    asked: list[tuple[int, int]] = []

    def frame(start: int, size: int) -> tuple[bytes, bytes]:
        asked.append((start, size))
        return b"<%d:%d>" % (start, size), b"</>"

    for offset in (0, blank_at - 100, blank_at + BLANK_BYTES, SEGMENT_BYTES - 1, end):
        asked.clear()
        start, data = commitlog.read_tail(offset, 64 * 1024)
        framed = commitlog.read_tail_framed(offset, 64 * 1024, frame)
        if data:
            assert asked == [(start, len(data))]
            assert framed == (start, len(data), b"<%d:%d>" % (start, len(data)) + data + b"</>")
        else:
            assert asked == [] and framed == (offset, 0, b"")
