"""tide.v1.Storage as a real process over real gRPC: every RPC, its errors, health,
reflection, the command line, the store lock and a clean restart."""

from __future__ import annotations

import functools
import itertools
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.storage.engine.system_topics import KEPT_TOPICS
from tests.services.storage.conftest import (
    MAX_BODY_BYTES,
    REPO,
    RPC_TIMEOUT_S,
    SEGMENT_BYTES,
    StorageLauncher,
    StorageProcess,
    cancel,
    expect_error,
    message,
    rpc_error,
    segment_files,
)
from tide.format import (
    BLANK_MAGIC,
    BLANK_MARKER_BYTES,
    SYSFLAG_BORN_HOST_V6,
    HostAddress,
    ScanKind,
    decode_record,
    parse_msg_id,
    scan_record,
)
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until

INVALID = grpc.StatusCode.INVALID_ARGUMENT
MAX_TAIL_CHUNK = 4 * 1024 * 1024
DEFAULT_QUEUE_NUMS = 4


# -- helpers -------------------------------------------------------------------------
def read_one(storage: StorageProcess, result: pb.AppendResult) -> pb.StoredMessage:
    (found,) = storage.read([(result.physical_offset, result.size)])
    assert found.status == pb.FOUND, found
    return found.message


def open_tail(
    storage: StorageProcess, offset: int, max_chunk_bytes: int = 0
) -> grpc.CallIterator[pb.TailChunk]:
    request = pb.TailRequest(offset=offset, max_chunk_bytes=max_chunk_bytes)
    return storage.stub.Tail(request, timeout=RPC_TIMEOUT_S)


def tail_until(
    storage: StorageProcess, offset: int, end: int, max_chunk_bytes: int = 0
) -> list[pb.TailChunk]:
    """Chunks from ``offset`` until one reaches ``end``; the stream is then cancelled."""
    call = open_tail(storage, offset, max_chunk_bytes)
    chunks: list[pb.TailChunk] = []
    try:
        for chunk in call:
            chunks.append(chunk)
            if chunk.offset + len(chunk.data) >= end:
                break
    finally:
        cancel(call)
    assert chunks, "the Tail stream ended without data"
    last = chunks[-1]
    assert last.offset + len(last.data) >= end, f"the Tail stream ended at {last}"
    return chunks


def next_chunk(chunks: Iterator[pb.TailChunk]) -> pb.TailChunk:
    try:
        return next(chunks)
    except StopIteration:
        pytest.fail("the Tail stream ended")


def is_blank_marker(data: bytes, pos: int) -> bool:
    return data[pos + 4 : pos + 8] == BLANK_MAGIC.to_bytes(4, "big", signed=True)


def records_in(data: bytes, base: int) -> list[tuple[int, bytes, str, int, int]]:
    """(physical_offset, body, topic, queue_id, queue_offset) of the records in ``data``
    (commitlog bytes from offset ``base``, one segment), up to a blank marker or the end.
    Tail sends a blank marker as its 8 bytes alone (the filler after it is skipped)."""
    found = []
    pos = 0
    while pos < len(data):
        if len(data) - pos == BLANK_MARKER_BYTES and is_blank_marker(data, pos):
            break
        scan = scan_record(data, pos, len(data), expected_offset=base + pos)
        if scan.kind is not ScanKind.RECORD:
            assert scan.kind in (ScanKind.BLANK, ScanKind.END), (base + pos, scan)
            break
        record = decode_record(data, pos, len(data), expected_offset=base + pos)
        found.append(
            (
                record.physical_offset,
                record.body,
                record.topic,
                record.queue_id,
                record.queue_offset,
            )
        )
        pos += scan.size
    return found


def expected_records(
    messages: list[pb.Message], results: list[pb.AppendResult]
) -> list[tuple[int, bytes, str, int, int]]:
    return [
        (r.physical_offset, m.body, m.topic, m.queue_id, r.queue_offset)
        for m, r in zip(messages, results, strict=True)
    ]


# -- Append ------------------------------------------------------------------------------
def test_append_results_in_order_with_ids_offsets_and_status(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    queues = [0, 1, 0, 2, 1, 0]
    batch = [message(topic_name, q, f"m{i}".encode()) for i, q in enumerate(queues)]

    results = shared_storage.append(batch)
    second = shared_storage.append(batch[:2])

    store = HostAddress("127.0.0.1", shared_storage.port)
    for result in [*results, *second]:
        assert result.status == pb.PUT_OK == 0
        assert len(result.msg_id) == 32
        assert result.msg_id == result.msg_id.upper()
        assert parse_msg_id(result.msg_id) == (store, result.physical_offset)
        # formats.md: 91 + body + topic + properties bytes with IPv4 hosts.
        assert result.size == 91 + 2 + len(topic_name)
    offsets = [r.physical_offset for r in [*results, *second]]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    for earlier, later in itertools.pairwise(results):
        assert later.physical_offset >= earlier.physical_offset + earlier.size
    assert [r.queue_offset for r in results] == [0, 0, 1, 0, 1, 2]
    assert [r.queue_offset for r in second] == [3, 2]
    for index, result in enumerate(results):
        stored = read_one(shared_storage, result)
        assert (stored.queue_id, stored.body) == (queues[index], f"m{index}".encode())
        assert stored.msg_id == result.msg_id


def test_append_empty_batch_is_invalid(shared_storage: StorageProcess) -> None:
    expect_error(INVALID, lambda: shared_storage.append([]), "at least one message")


def test_append_too_many_messages_is_invalid(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    before = shared_storage.status().max_offset
    batch = [message(topic_name, 0, b"x")] * 11
    expect_error(INVALID, lambda: shared_storage.append(batch), "11", "10", "split")
    assert shared_storage.status().max_offset == before
    assert len(shared_storage.append(batch[:10])) == 10


@pytest.mark.parametrize(
    ("topic", "fragment"),
    [
        ("bad topic", "allowed characters"),
        ("a/b", "allowed characters"),
        ("", "empty"),
        ("x" * 128, "127"),
    ],
)
def test_append_bad_topic_is_invalid(
    shared_storage: StorageProcess, topic: str, fragment: str
) -> None:
    before = shared_storage.status()
    details = expect_error(
        INVALID, lambda: shared_storage.append([message(topic)]), "topic", fragment
    )
    assert "message[0]" in details or topic[:10] in details
    after = shared_storage.status()
    assert (after.max_offset, after.topic_count) == (before.max_offset, before.topic_count)


@pytest.mark.parametrize("queue_id", [DEFAULT_QUEUE_NUMS, -1, 1000])
def test_append_queue_id_out_of_range_is_invalid(
    shared_storage: StorageProcess, topic_name: str, queue_id: int
) -> None:
    expect_error(
        INVALID,
        lambda: shared_storage.append([message(topic_name, queue_id)]),
        f"queue_id {queue_id}",
        f"0..{DEFAULT_QUEUE_NUMS - 1}",
    )


def test_append_body_over_the_limit_is_invalid(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    too_big = message(topic_name, 0, b"x" * (MAX_BODY_BYTES + 1))
    expect_error(
        INVALID,
        lambda: shared_storage.append([too_big]),
        str(MAX_BODY_BYTES + 1),
        str(MAX_BODY_BYTES),
        "--max-message-body-bytes",
    )
    at_limit = message(topic_name, 0, b"y" * MAX_BODY_BYTES)
    (result,) = shared_storage.append([at_limit])
    assert read_one(shared_storage, result).body == at_limit.body


@pytest.mark.parametrize("keys", [["a b"], ["ok", ""], [" lead"]])
def test_append_key_with_a_space_is_invalid(
    shared_storage: StorageProcess, topic_name: str, keys: list[str]
) -> None:
    expect_error(INVALID, lambda: shared_storage.append([message(topic_name, keys=keys)]), "space")


@pytest.mark.parametrize(
    ("props", "fragment"),
    [
        ({"a\x01b": "v"}, "the name of property 'a\\x01b'"),
        ({"name": "v\x02"}, "the value of property 'name'"),
        ({"": "v"}, "name is empty"),
    ],
)
def test_append_property_with_a_separator_is_invalid(
    shared_storage: StorageProcess, topic_name: str, props: dict[str, str], fragment: str
) -> None:
    expect_error(
        INVALID,
        lambda: shared_storage.append([message(topic_name, properties=props)]),
        "message[0]",
        "property",
        fragment,
    )


def test_a_batch_with_one_bad_message_writes_nothing(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    (first,) = shared_storage.append([message(topic_name, 0, b"before")])
    before = shared_storage.status().max_offset
    batch = [
        message(topic_name, 0, b"good-1"),
        message(topic_name, 1, b"good-2"),
        message(topic_name, 0, b"x" * (MAX_BODY_BYTES + 1)),
        message(topic_name, 0, b"good-3"),
    ]
    details = expect_error(INVALID, lambda: shared_storage.append(batch), "message[2]")
    assert "body" in details
    assert shared_storage.status().max_offset == before
    # No queue offset was used up by the rejected batch.
    (after,) = shared_storage.append([message(topic_name, 0, b"after")])
    assert after.queue_offset == first.queue_offset + 1
    assert after.physical_offset == before


def test_a_rejected_batch_creates_no_topic(shared_storage: StorageProcess, topic_name: str) -> None:
    """The batch is validated as a whole before anything happens: a valid message for a
    new topic in a rejected batch must not auto-create that topic."""
    before = shared_storage.status()
    batch = [
        message(f"{topic_name}_new", 0, b"fine"),
        message(topic_name, 0, b"x" * (MAX_BODY_BYTES + 1)),
    ]
    expect_error(INVALID, lambda: shared_storage.append(batch), "message[1]")
    bad_queue = [message(f"{topic_name}_other", DEFAULT_QUEUE_NUMS)]
    expect_error(INVALID, lambda: shared_storage.append(bad_queue), "message[0]")
    after = shared_storage.status()
    assert after.max_offset == before.max_offset
    names = {t.topic_name for t in list_topics(shared_storage).topics}
    assert not {f"{topic_name}_new", f"{topic_name}_other"} & names, sorted(names)
    assert after.topic_count == before.topic_count


@pytest.mark.parametrize(
    "born_host", ["not-a-host", "1.2.3.4", "1.2.3.4:70000", "1.2.3.999:80", "[::1]", "host:80"]
)
def test_append_malformed_born_host_is_invalid(
    shared_storage: StorageProcess, topic_name: str, born_host: str
) -> None:
    expect_error(
        INVALID,
        lambda: shared_storage.append([message(topic_name, born_host=born_host)]),
        "born_host",
        born_host,
    )


def test_born_host_is_stored_as_given_else_the_peer(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    given_v4, given_v6, peer = shared_storage.append(
        [
            message(topic_name, 0, b"v4", born_host="10.1.2.3:4567"),
            message(topic_name, 0, b"v6", born_host="[2001:db8::7]:9876"),
            message(topic_name, 0, b"peer"),
        ]
    )
    stored_v4 = read_one(shared_storage, given_v4)
    assert stored_v4.born_host == "10.1.2.3:4567"
    assert not stored_v4.sys_flag & SYSFLAG_BORN_HOST_V6
    stored_v6 = read_one(shared_storage, given_v6)
    assert stored_v6.born_host == "[2001:db8::7]:9876"
    assert stored_v6.sys_flag & SYSFLAG_BORN_HOST_V6
    assert given_v6.size == given_v4.size + 12  # a 20-byte born host instead of 8
    stored_peer = read_one(shared_storage, peer)
    ip, _, port = stored_peer.born_host.rpartition(":")
    assert ip == "127.0.0.1", stored_peer.born_host
    # The client's own (ephemeral) port, not the store's.
    assert 0 < int(port) <= 65535 and int(port) != shared_storage.port


def test_unknown_topic_without_auto_create_is_not_found(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    storage = launcher.start(tmp_path / "store", "--no-auto-create-topics")
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: storage.append([message("Unknown")]),
        "Unknown",
        "UpsertTopic",
    )
    assert storage.status().max_offset == 0
    assert not storage.stub.ListTopics(pb.ListTopicsRequest(), timeout=RPC_TIMEOUT_S).topics

    two = pb.TopicConfig(topic_name="Two", read_queue_nums=2, write_queue_nums=2)
    storage.stub.UpsertTopic(pb.UpsertTopicRequest(topic=two), timeout=RPC_TIMEOUT_S)
    expect_error(INVALID, lambda: storage.append([message("Two", 2)]), "queue_id 2", "0..1")
    results = storage.append([message("Two", 0), message("Two", 1)])
    assert [r.queue_offset for r in results] == [0, 0]
    storage.stop()


# -- Read --------------------------------------------------------------------------------
def test_read_decodes_every_field(shared_storage: StorageProcess, topic_name: str) -> None:
    body = bytes(range(256)) * 3
    user = {"color": "blue", "ünï": "çødé ß", "empty": ""}
    sent = message(
        topic_name,
        3,
        body,
        tags="TagA",
        keys=["k1", "order-42"],
        properties=user,
        flag=0x1234,
        born_timestamp_ms=1_700_000_000_123,
        born_host="192.168.7.8:31000",
        reconsume_times=2,
        prepared_transaction_offset=77,
    )
    default_clock = message(topic_name, 3, b"now")
    wall_before = time.time_ns() // 1_000_000
    result, clocked = shared_storage.append([sent, default_clock])
    wall_after = time.time_ns() // 1_000_000

    stored = read_one(shared_storage, result)
    assert stored.topic == topic_name
    assert stored.queue_id == 3
    assert stored.body == body
    assert stored.body_crc == zlib.crc32(body)
    assert stored.tags == "TagA"
    assert list(stored.keys) == ["k1", "order-42"]
    assert dict(stored.properties) == {**user, "TAGS": "TagA", "KEYS": "k1 order-42"}
    assert stored.flag == 0x1234
    assert stored.born_timestamp_ms == 1_700_000_000_123
    assert stored.born_host == "192.168.7.8:31000"
    assert stored.sys_flag == 0
    assert stored.reconsume_times == 2
    assert stored.prepared_transaction_offset == 77
    assert stored.queue_offset == result.queue_offset == 0
    assert stored.physical_offset == result.physical_offset
    assert stored.size == result.size
    assert stored.store_timestamp_ms == result.store_timestamp_ms
    assert wall_before <= stored.store_timestamp_ms <= wall_after
    assert stored.store_host == shared_storage.listen
    assert stored.msg_id == result.msg_id

    # born_timestamp_ms 0: the store's clock; no tags/keys/properties: none stored.
    now = read_one(shared_storage, clocked)
    assert wall_before <= now.born_timestamp_ms <= wall_after
    assert (now.tags, list(now.keys), dict(now.properties)) == ("", [], {})
    assert now.queue_offset == 1
    assert now.body_crc == zlib.crc32(b"now")


def test_read_results_follow_request_order(shared_storage: StorageProcess, topic_name: str) -> None:
    results = shared_storage.append([message(topic_name, 0, f"r{i}".encode()) for i in range(5)])
    order = [3, 0, 4, 1, 2, 3]
    found = shared_storage.read([(results[i].physical_offset, results[i].size) for i in order])
    assert [f.message.body for f in found] == [f"r{i}".encode() for i in order]


def test_read_past_the_end_is_offset_above_max(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    (last,) = shared_storage.append([message(topic_name)])
    end = shared_storage.status().max_offset
    found = shared_storage.read(
        [
            (end, 100),
            (end + 10_000_000, 100),
            (last.physical_offset, last.size + 1),  # runs past the last written byte
            (last.physical_offset, last.size),
        ]
    )
    assert [f.status for f in found] == [
        pb.OFFSET_ABOVE_MAX,
        pb.OFFSET_ABOVE_MAX,
        pb.OFFSET_ABOVE_MAX,
        pb.FOUND,
    ]
    assert not found[0].HasField("message")


def test_read_wrong_size_or_offset_is_not_a_record(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    first, _second, _third = shared_storage.append(
        [
            message(topic_name, 0, b"a" * 100),
            message(topic_name, 0, b"b" * 100),
            message(topic_name),
        ]
    )
    offset, size = first.physical_offset, first.size
    cases = {
        "size too small": (offset, size - 1),
        "offset in the middle": (offset + 4, size),
        "offset inside the body": (offset + 100, size),
        "size too large": (offset, size + 1),
    }
    found = shared_storage.read(cases.values())
    statuses = {name: pb.ReadStatus.Name(f.status) for name, f in zip(cases, found, strict=True)}
    assert statuses == dict.fromkeys(cases, "NOT_A_RECORD")


def test_read_more_than_1024_positions_is_invalid(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    (result,) = shared_storage.append([message(topic_name)])
    position = pb.ReadRequest.Position(physical_offset=result.physical_offset, size=result.size)
    read = shared_storage.stub.Read
    ok = read(pb.ReadRequest(positions=[position] * 1024), timeout=RPC_TIMEOUT_S)
    assert len(ok.results) == 1024 and all(r.status == pb.FOUND for r in ok.results)
    expect_error(
        INVALID,
        lambda: read(pb.ReadRequest(positions=[position] * 1025), timeout=RPC_TIMEOUT_S),
        "1025",
        "1024",
    )


def test_read_over_64_mib_is_resource_exhausted(shared_storage: StorageProcess) -> None:
    positions = [pb.ReadRequest.Position(physical_offset=0, size=40 << 20)] * 2
    expect_error(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        lambda: shared_storage.stub.Read(
            pb.ReadRequest(positions=positions), timeout=RPC_TIMEOUT_S
        ),
        str(80 << 20),
        "split",
    )


@pytest.mark.parametrize(("offset", "size"), [(-1, 100), (-(2**40), 100), (0, -5)])
def test_read_negative_offset_or_bad_size_is_invalid(
    shared_storage: StorageProcess, offset: int, size: int
) -> None:
    request = pb.ReadRequest(positions=[pb.ReadRequest.Position(physical_offset=offset, size=size)])
    expect_error(
        INVALID,
        lambda: shared_storage.stub.Read(request, timeout=RPC_TIMEOUT_S),
        "positions[0]",
        "physical_offset and size must be >= 0",
    )


def test_read_size_zero_takes_the_size_from_the_record(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    first, second = shared_storage.append(
        [message(topic_name, 0, b"a" * 100), message(topic_name, 0, b"b" * 7)]
    )
    found = shared_storage.read(
        [
            (second.physical_offset, 0),
            (first.physical_offset, 0),
            (first.physical_offset + 4, 0),  # the magic code is no size
            (first.physical_offset + 100, 0),  # body bytes: "aaaa" is too big a size
            (shared_storage.status().max_offset, 0),
        ]
    )
    assert [f.message.body for f in found[:2]] == [b"b" * 7, b"a" * 100]
    assert [f.message.size for f in found[:2]] == [second.size, first.size]
    assert [pb.ReadStatus.Name(f.status) for f in found[2:]] == [
        "NOT_A_RECORD",
        "NOT_A_RECORD",
        "OFFSET_ABOVE_MAX",
    ]


# -- Tail --------------------------------------------------------------------------------
def test_tail_from_zero_is_the_commitlog_bytes(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = launcher.start(tmp_path / "store")
    messages: list[pb.Message] = []
    results: list[pb.AppendResult] = []
    for batch in range(5):
        sent = [
            message(f"Topic{q % 2}", q, f"b{batch}-{i}".encode() * (i + 1), tags=f"t{i}")
            for i, q in enumerate([0, 1, 2, 3, 0, 1])
        ]
        messages += sent
        results += storage.append(sent)
    end = storage.status().max_offset
    assert end == results[-1].physical_offset + results[-1].size

    chunks = tail_until(storage, 0, end)
    data = b"".join(c.data for c in chunks)
    assert chunks[0].offset == 0
    for earlier, later in itertools.pairwise(chunks):
        assert later.offset == earlier.offset + len(earlier.data)
    for chunk in chunks:
        assert chunk.max_offset >= chunk.offset + len(chunk.data)
    assert len(data) == end
    assert records_in(data, 0) == expected_records(messages, results)

    storage.stop()
    segment = segment_files(tmp_path / "store")[0]
    assert segment.name == "00000000000000000000"
    assert segment.read_bytes()[:end] == data


def test_tail_at_the_max_offset_receives_new_appends(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    start = shared_storage.status().max_offset
    call = open_tail(shared_storage, start)
    try:
        chunks = iter(call)
        for round_ in range(3):
            sent = [message(topic_name, 0, f"live-{round_}-{i}".encode()) for i in range(3)]
            results = shared_storage.append(sent)
            end = results[-1].physical_offset + results[-1].size
            data = b""
            base = results[0].physical_offset
            while len(data) < end - base:
                chunk = next_chunk(chunks)
                if chunk.offset + len(chunk.data) <= base:
                    continue  # the blank end of a full segment before a roll
                assert chunk.offset == base + len(data), (chunk.offset, base, len(data))
                data += chunk.data
            assert records_in(data, base) == expected_records(sent, results)
    finally:
        cancel(call)


def test_tail_chunks_respect_max_chunk_bytes(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    shared_storage.append([message(topic_name, 0, b"z" * 3000) for _ in range(3)])
    end = shared_storage.status().max_offset
    start = max(0, end - 9000)
    chunks = tail_until(shared_storage, start, end, max_chunk_bytes=1000)
    assert all(0 < len(c.data) <= 1000 for c in chunks), [len(c.data) for c in chunks]
    assert len(chunks) >= 9
    (one,) = tail_until(shared_storage, end - 1, end, max_chunk_bytes=1)
    assert (one.offset, len(one.data)) == (end - 1, 1)


@pytest.mark.parametrize("max_chunk_bytes", [MAX_TAIL_CHUNK + 1, 2**31 - 1, -1])
def test_tail_max_chunk_bytes_out_of_range_is_invalid(
    shared_storage: StorageProcess, max_chunk_bytes: int
) -> None:
    expect_error(
        INVALID,
        lambda: next(iter(open_tail(shared_storage, 0, max_chunk_bytes))),
        "max_chunk_bytes",
        str(MAX_TAIL_CHUNK),
    )


def test_tail_accepts_4_mib_chunks(shared_storage: StorageProcess, topic_name: str) -> None:
    shared_storage.append([message(topic_name)])
    end = shared_storage.status().max_offset
    chunks = tail_until(shared_storage, 0, end, max_chunk_bytes=MAX_TAIL_CHUNK)
    assert all(len(c.data) <= MAX_TAIL_CHUNK for c in chunks)


def test_tail_past_the_max_offset_is_out_of_range(shared_storage: StorageProcess) -> None:
    end = shared_storage.status().max_offset
    expect_error(
        grpc.StatusCode.OUT_OF_RANGE,
        lambda: next(iter(open_tail(shared_storage, end + 1))),
        str(end + 1),
        str(end),
    )


def test_tail_across_segment_rolls(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = launcher.start(tmp_path / "store")
    messages: list[pb.Message] = []
    results: list[pb.AppendResult] = []
    for batch in range(6):  # 6 * 10 * ~50 KB: three segments of 1 MiB
        sent = [
            message("Rolls", i % 4, bytes([65 + batch]) * 50_000 + f"{batch}-{i}".encode())
            for i in range(10)
        ]
        messages += sent
        results += storage.append(sent)
    end = storage.status().max_offset
    assert end > 2 * SEGMENT_BYTES
    assert storage.status().segment_count == 3

    chunks = tail_until(storage, 0, end, max_chunk_bytes=100_000)
    segments: dict[int, bytearray] = {}
    expected_next = 0
    for chunk in chunks:
        first = chunk.offset // SEGMENT_BYTES
        assert 0 < len(chunk.data) <= 100_000
        last_byte = chunk.offset + len(chunk.data) - 1
        assert last_byte // SEGMENT_BYTES == first, f"chunk at {chunk.offset} crosses a segment"
        if chunk.offset != expected_next:
            # Only after a blank marker, and then at the next segment's first offset.
            assert chunk.offset == (expected_next // SEGMENT_BYTES + 1) * SEGMENT_BYTES
            previous = segments[expected_next // SEGMENT_BYTES]
            assert BLANK_MAGIC.to_bytes(4, "big", signed=True) in previous[-SEGMENT_BYTES:]
        buffer = segments.setdefault(first, bytearray())
        assert chunk.offset == first * SEGMENT_BYTES + len(buffer)
        buffer += chunk.data
        expected_next = chunk.offset + len(chunk.data)
    assert sorted(segments) == [0, 1, 2]

    sizes = {r.physical_offset: r.size for r in results}
    seen: list[tuple[int, bytes, str, int, int]] = []
    for index in sorted(segments):
        data = bytes(segments[index])
        base = index * SEGMENT_BYTES
        records = records_in(data, base)
        seen += records
        if index < 2:  # a full segment: its blank marker ends the data sent, no filler
            pos = records[-1][0] + sizes[records[-1][0]] - base
            assert len(data) == pos + BLANK_MARKER_BYTES
            assert is_blank_marker(data, pos)
            assert int.from_bytes(data[pos : pos + 4], "big") == SEGMENT_BYTES - pos
    assert seen == expected_records(messages, results)
    assert {r.physical_offset // SEGMENT_BYTES for r in results} == {0, 1, 2}
    storage.stop()


# -- GetStatus ---------------------------------------------------------------------------
def test_get_status_fields(shared_storage: StorageProcess, topic_name: str) -> None:
    results = shared_storage.append([message(topic_name, 0, b"s" * 5000)])
    status = shared_storage.status()
    assert status.min_offset == 0
    assert status.max_offset == results[-1].physical_offset + results[-1].size
    assert 0 <= status.flushed_offset <= status.max_offset
    assert status.flushed_offset <= status.committed_offset <= status.max_offset
    assert status.committed_offset == status.max_offset  # no write buffer pool
    assert status.segment_size_bytes == SEGMENT_BYTES
    assert status.segment_count == (status.max_offset - 1) // SEGMENT_BYTES + 1
    assert 0.0 < status.disk_usage_ratio < 1.0
    assert status.writable
    assert status.flush_mode == "async"
    assert Path(status.store_dir) == shared_storage.store_dir
    assert status.store_host == shared_storage.listen
    assert status.recovery.startswith("normal"), status.recovery
    assert status.recovery_truncated_bytes == 0
    # The count holds every topic, the system topics too (ListTopics hides them).
    every = pb.ListTopicsRequest(include_hidden=True)
    topics = shared_storage.stub.ListTopics(every, timeout=RPC_TIMEOUT_S)
    assert status.topic_count == len(topics.topics) >= 1


def test_sync_flush_status(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = launcher.start(tmp_path / "store", "--flush", "sync")
    results = storage.append([message("Sync", 0, b"durable")] * 3)
    assert all(r.status == pb.PUT_OK for r in results)
    status = storage.status()
    assert status.flush_mode == "sync"
    end = results[-1].physical_offset + results[-1].size
    # Acknowledged under SYNC_FLUSH: flushed before the answer.
    assert status.flushed_offset == status.committed_offset == status.max_offset == end
    storage.stop()


# -- topics ------------------------------------------------------------------------------
def list_topics(storage: StorageProcess) -> pb.ListTopicsResponse:
    return storage.stub.ListTopics(pb.ListTopicsRequest(), timeout=RPC_TIMEOUT_S)


def upsert(storage: StorageProcess, topic: pb.TopicConfig) -> pb.TopicConfig:
    return storage.stub.UpsertTopic(pb.UpsertTopicRequest(topic=topic), timeout=RPC_TIMEOUT_S)


def test_upsert_list_delete_topic(shared_storage: StorageProcess, topic_name: str) -> None:
    before = list_topics(shared_storage)
    config = pb.TopicConfig(
        topic_name=topic_name, read_queue_nums=8, write_queue_nums=6, perm=6, order=True
    )
    assert upsert(shared_storage, config) == config
    after = list_topics(shared_storage)
    assert config in after.topics
    assert len(after.topics) == len(before.topics) + 1
    assert after.data_version_counter > before.data_version_counter
    assert after.data_version_timestamp_ms >= before.data_version_timestamp_ms > 0

    # Default perm (0 means "read + write") and a change of an existing topic.
    changed = pb.TopicConfig(topic_name=topic_name, read_queue_nums=2, write_queue_nums=2)
    assert upsert(shared_storage, changed).perm == 6
    listed = {t.topic_name: t for t in list_topics(shared_storage).topics}
    assert (listed[topic_name].read_queue_nums, listed[topic_name].write_queue_nums) == (2, 2)
    hidden = {topic for topic, _ in KEPT_TOPICS}  # left out of listings, counted in status
    assert shared_storage.status().topic_count == len(listed) + len(hidden)

    delete = shared_storage.stub.DeleteTopic
    assert delete(pb.DeleteTopicRequest(topic=topic_name), timeout=RPC_TIMEOUT_S).existed
    assert topic_name not in {t.topic_name for t in list_topics(shared_storage).topics}
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: delete(pb.DeleteTopicRequest(topic=topic_name), timeout=RPC_TIMEOUT_S),
        topic_name,
    )


def test_delete_missing_topic_is_not_found(shared_storage: StorageProcess) -> None:
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: shared_storage.stub.DeleteTopic(
            pb.DeleteTopicRequest(topic="NeverCreated"), timeout=RPC_TIMEOUT_S
        ),
        "NeverCreated",
        "does not exist",
    )


@pytest.mark.parametrize(
    ("name", "read", "write", "perm", "fragments"),
    [
        ("bad name", 4, 4, 6, ("allowed characters",)),
        ("", 4, 4, 6, ("empty",)),
        ("x" * 128, 4, 4, 6, ("127",)),
        ("ZeroQueues", 0, 0, 6, ("queue_nums", ">= 1")),
        ("ZeroRead", 0, 4, 6, ("read", "1..1024")),
        ("ZeroWrite", 4, 0, 6, ("write", "1..1024")),
        ("TooManyQueues", 1025, 4, 6, ("1025", "1..1024")),
        ("TooManyWrite", 4, 1025, 6, ("1025", "1..1024")),
        ("NegativeQueues", -1, 4, 6, ("-1", "1..1024")),
        ("BadPerm", 4, 4, 8, ("perm", "0..7")),
    ],
)
def test_upsert_bad_topic_is_invalid(
    shared_storage: StorageProcess,
    name: str,
    read: int,
    write: int,
    perm: int,
    fragments: tuple[str, ...],
) -> None:
    config = pb.TopicConfig(
        topic_name=name, read_queue_nums=read, write_queue_nums=write, perm=perm
    )
    expect_error(INVALID, lambda: upsert(shared_storage, config), *fragments)
    assert name not in {t.topic_name for t in list_topics(shared_storage).topics}


def test_append_beyond_the_write_queues_is_invalid(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    upsert(
        shared_storage,
        pb.TopicConfig(topic_name=topic_name, read_queue_nums=4, write_queue_nums=2),
    )
    expect_error(
        INVALID,
        lambda: shared_storage.append([message(topic_name, 2)]),
        "queue_id 2",
        "2 write queues",
        "0..1",
    )
    assert len(shared_storage.append([message(topic_name, 1)])) == 1


# -- consumer offsets --------------------------------------------------------------------
def get_offset(storage: StorageProcess, group: str, topic: str, queue_id: int) -> int:
    request = pb.GetOffsetRequest(consumer_group=group, topic=topic, queue_id=queue_id)
    return storage.stub.GetOffset(request, timeout=RPC_TIMEOUT_S).offset


def commit_offset(
    storage: StorageProcess, group: str, topic: str, queue_id: int, offset: int
) -> None:
    request = pb.CommitOffsetRequest(
        consumer_group=group, topic=topic, queue_id=queue_id, offset=offset
    )
    storage.stub.CommitOffset(request, timeout=RPC_TIMEOUT_S)


def test_commit_and_get_offset(shared_storage: StorageProcess, topic_name: str) -> None:
    assert get_offset(shared_storage, "GroupA", topic_name, 0) == -1
    shared_storage.append([message(topic_name, 0, b"m") for _ in range(9)])
    commit_offset(shared_storage, "GroupA", topic_name, 0, 9)
    commit_offset(shared_storage, "GroupA", topic_name, 3, 0)
    assert get_offset(shared_storage, "GroupA", topic_name, 0) == 9
    assert get_offset(shared_storage, "GroupA", topic_name, 3) == 0
    assert get_offset(shared_storage, "GroupA", topic_name, 1) == -1
    assert get_offset(shared_storage, "GroupB", topic_name, 0) == -1
    commit_offset(shared_storage, "GroupA", topic_name, 0, 7)  # moving back is allowed
    assert get_offset(shared_storage, "GroupA", topic_name, 0) == 7


def test_commit_past_the_queue_max_is_refused(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    """Issue 17 point 4: a commit past the queue's max (the offset its next message gets)
    is refused; stored, it made the group's next pull skip what was produced meanwhile."""
    shared_storage.append([message(topic_name, 0, b"m") for _ in range(3)])
    for offset in (4, 1_000_000_000):
        expect_error(
            INVALID,
            functools.partial(commit_offset, shared_storage, "G", topic_name, 0, offset),
            f"offset {offset} is past the max offset 3 of queue 0",
            "commit at most 3",
        )
    assert get_offset(shared_storage, "G", topic_name, 0) == -1  # nothing was stored
    expect_error(
        INVALID, lambda: commit_offset(shared_storage, "G", topic_name, 1, 1), "max offset 0"
    )
    commit_offset(shared_storage, "G", topic_name, 0, 3)  # everything consumed
    assert get_offset(shared_storage, "G", topic_name, 0) == 3


@pytest.mark.parametrize(
    ("group", "topic", "queue_id", "offset", "fragment"),
    [
        ("bad group", "T", 0, 1, "consumer group"),
        ("", "T", 0, 1, "consumer group is empty"),
        ("G", "bad topic", 0, 1, "topic"),
        ("G", "T", -1, 1, "queue id"),
        ("G", "T", 0, -1, "offset is -1"),
        ("G", "T", 0, -(2**62), "must be 0.."),
    ],
)
def test_commit_offset_bad_input_is_invalid(
    shared_storage: StorageProcess,
    group: str,
    topic: str,
    queue_id: int,
    offset: int,
    fragment: str,
) -> None:
    expect_error(
        INVALID,
        lambda: commit_offset(shared_storage, group, topic, queue_id, offset),
        fragment,
    )


@pytest.mark.parametrize(
    ("group", "topic", "queue_id"),
    [("bad group", "T", 0), ("G", "bad topic", 0), ("G", "T", -1), ("", "T", 0)],
)
def test_get_offset_bad_input_is_invalid(
    shared_storage: StorageProcess, group: str, topic: str, queue_id: int
) -> None:
    expect_error(INVALID, lambda: get_offset(shared_storage, group, topic, queue_id))


# -- health, reflection, command line --------------------------------------------------
def test_health_is_serving(shared_storage: StorageProcess) -> None:
    health = health_pb2_grpc.HealthStub(shared_storage.channel)
    for service in ("", "tide.v1.Storage"):
        response = health.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S
        )
        assert response.status == health_pb2.HealthCheckResponse.SERVING, service
    error = rpc_error(
        lambda: health.Check(
            health_pb2.HealthCheckRequest(service="tide.v1.Nope"), timeout=RPC_TIMEOUT_S
        )
    )
    assert error.code() is grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_services(shared_storage: StorageProcess) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(shared_storage.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    responses = list(reflection.ServerReflectionInfo(iter([request]), timeout=RPC_TIMEOUT_S))
    names = {s.name for s in responses[0].list_services_response.service}
    assert {
        "tide.v1.Storage",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= names

    symbol = reflection_pb2.ServerReflectionRequest(file_containing_symbol="tide.v1.Storage")
    (answer,) = reflection.ServerReflectionInfo(iter([symbol]), timeout=RPC_TIMEOUT_S)
    assert answer.file_descriptor_response.file_descriptor_proto


def test_help_documents_options_and_units() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.storage", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "--segment-size-bytes INT commitlog segment size [unit: bytes]" in text
    assert "--flush-interval-ms INT async flush interval [unit: ms]" in text
    assert (
        "--max-message-body-bytes INT largest message body accepted (at most 33554432: "
        "MESSAGE_BODY_MAX_BYTES) [unit: bytes]"
    ) in text
    for flag in ("--store-dir", "--listen", "--flush {sync,async}", "--no-auto-create-topics"):
        assert flag in text, flag


# -- process lifecycle -------------------------------------------------------------------
def test_second_process_on_the_same_store_fails_fast(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    first = launcher.start(store)
    (result,) = first.append([message("Held", 0, b"mine")])
    second = launcher.spawn(store)
    started = time.monotonic()
    code = second.wait_exit(timeout_s=30)
    assert code != 0, second.describe()
    assert time.monotonic() - started < 20, "the second process should fail at once"
    assert "in use" in second.stderr(), second.describe()
    assert not second.ready_file.exists()
    # The first one is untouched.
    assert read_one(first, result).body == b"mine"
    assert (store / "abort").exists()
    first.stop()
    assert not (store / "abort").exists()


def test_sigterm_exits_0_and_restart_is_normal(launcher: StorageLauncher, tmp_path: Path) -> None:
    store = tmp_path / "store"
    storage = launcher.start(store)
    upsert(storage, pb.TopicConfig(topic_name="Kept", read_queue_nums=3, write_queue_nums=3))
    results = storage.append([message("Kept", q % 3, f"k{q}".encode()) for q in range(7)])
    results += storage.append([message("Auto", 1, b"auto")])
    commit_offset(storage, "Consumers", "Kept", 2, 2)  # queue 2 holds k2 and k5
    commit_offset(storage, "Consumers", "Auto", 1, 1)
    topics_before = {t.topic_name: t for t in list_topics(storage).topics}
    end = storage.status().max_offset
    storage.stop()
    assert not (store / "abort").exists()

    again = launcher.start(store)
    status = again.status()
    assert status.recovery.startswith("normal"), status.recovery
    assert "CORRUPTION" not in status.recovery
    assert status.max_offset == status.flushed_offset == end
    assert {t.topic_name: t for t in list_topics(again).topics} == topics_before
    assert topics_before["Kept"].write_queue_nums == 3
    assert get_offset(again, "Consumers", "Kept", 2) == 2
    assert get_offset(again, "Consumers", "Auto", 1) == 1
    assert get_offset(again, "Consumers", "Kept", 0) == -1
    found = again.read([(r.physical_offset, r.size) for r in results])
    assert [f.message.body for f in found] == [*(f"k{q}".encode() for q in range(7)), b"auto"]
    # Queue offsets continue after the restart.
    (more,) = again.append([message("Kept", 0, b"more")])
    assert more.queue_offset == 3
    assert more.physical_offset == end
    again.stop()


def test_sigterm_ends_open_tail_streams(launcher: StorageLauncher, tmp_path: Path) -> None:
    storage = launcher.start(tmp_path / "store", "--shutdown-grace-s", "25")
    storage.append([message("Streamed")])
    end = storage.status().max_offset
    call = open_tail(storage, 0)
    chunks = iter(call)
    received = 0
    while received < end:
        received += len(next_chunk(chunks).data)
    storage.proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    code = storage.wait_exit()
    # The open stream must not hold the shutdown for the whole grace period.
    assert time.monotonic() - started < 15, "an open Tail held the shutdown"
    assert code == 0, storage.describe()
    wait_until(lambda: not call.is_active(), "the Tail stream to end")
    storage.close_channel()
