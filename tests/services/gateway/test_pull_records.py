"""Pulls answered as stored records (``ENCODING_RECORDS``) in a real cluster: the same
messages as a decoded pull, byte for byte what the commitlog holds, tag expressions
matched exactly, --max-pull-bytes honoured, long polls woken; and the gateway's checks of
the storage's span answers (pull_records.py)."""

from __future__ import annotations

import time

import grpc
import pytest

from services.gateway.pull_records import (
    SpanReadMismatch,
    cached_records,
    found_records,
    matching_records,
)
from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.format import (
    TAGS,
    decode_record,
    encode_properties,
    encode_record,
    pack_host,
    parse_host,
)
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

Status = pb.PullResponse.Status
RECORDS = pb.PullRequest.ENCODING_RECORDS
MAX_PULL_BYTES = 2_000
records_cluster = cluster_fixture(
    name="records_cluster", brokers=1, gateway_args=("--max-pull-bytes", str(MAX_PULL_BYTES))
)


def pull(topic: str, offset: int = 0, **fields: object) -> pb.PullRequest:
    return pb.PullRequest(topic=topic, broker_name="broker-a", queue_id=0, offset=offset, **fields)  # type: ignore[arg-type]


def produce(cluster: Cluster, topic: str, bodies_tags: list[tuple[bytes, str]]) -> None:
    """Produce to queue 0 of broker-a and wait until the dispatch has it all."""
    before = cluster.queue_max(topic)
    messages = [
        pb.ProduceMessage(
            topic=topic,
            body=body,
            tags=tags,
            keys=[f"k{index}"],
            properties={"color": "blue"},
            queue=pb.QueueRef(broker_name="broker-a", queue_id=0),
        )
        for index, (body, tags) in enumerate(bodies_tags)
    ]
    cluster.gateway.stub.Produce(pb.ProduceRequest(messages=messages), timeout=RPC_TIMEOUT_S)
    cluster.wait_dispatched(topic, before + len(messages))


def decoded(answer: pb.PullResponse) -> list[tuple[bytes, str, int, int, str]]:
    """(body, topic, queue offset, physical offset, tags) of each record in ``answer``."""
    out = []
    pos = 0
    for _ in range(answer.record_count):
        record = decode_record(answer.records, pos, len(answer.records))
        out.append(
            (
                record.body,
                record.topic,
                record.queue_offset,
                record.physical_offset,
                record.properties.get(TAGS, ""),
            )
        )
        pos += record.total_size
    assert pos == len(answer.records)
    return out


def test_records_pull_equals_messages_pull(records_cluster: Cluster) -> None:
    cluster = records_cluster
    cluster.create_topic("T_records_same", queues=1)
    produce(cluster, "T_records_same", [(f"body-{i}".encode(), f"tag{i % 3}") for i in range(40)])
    stub = cluster.gateway.stub
    for offset in (0, 7, 39):
        messages = stub.Pull(pull("T_records_same", offset), timeout=RPC_TIMEOUT_S)
        records = stub.Pull(pull("T_records_same", offset, encoding=RECORDS), timeout=RPC_TIMEOUT_S)
        assert records.status == messages.status == Status.FOUND
        assert not records.messages and not messages.records
        assert records.next_offset == messages.next_offset
        assert (records.min_offset, records.max_offset) == (0, 40)
        assert decoded(records) == [
            (m.body, m.topic, m.queue_offset, m.physical_offset, m.tags) for m in messages.messages
        ]


def test_records_pull_at_the_end_and_past_it(records_cluster: Cluster) -> None:
    cluster = records_cluster
    cluster.create_topic("T_records_end", queues=1)
    stub = cluster.gateway.stub
    never = stub.Pull(pull("T_records_end", 3, encoding=RECORDS), timeout=RPC_TIMEOUT_S)
    assert (never.status, never.next_offset, never.record_count) == (Status.OFFSET_ILLEGAL, 0, 0)
    produce(cluster, "T_records_end", [(b"x", "")] * 5)
    end = stub.Pull(pull("T_records_end", 5, encoding=RECORDS), timeout=RPC_TIMEOUT_S)
    assert (end.status, end.next_offset, end.records) == (Status.NO_NEW_MESSAGE, 5, b"")
    past = stub.Pull(pull("T_records_end", 9, encoding=RECORDS), timeout=RPC_TIMEOUT_S)
    assert (past.status, past.next_offset) == (Status.OFFSET_ILLEGAL, 5)


def test_records_pull_matches_tags_exactly(records_cluster: Cluster) -> None:
    """ "Aa" and "BB" share a Java hash code: the dispatch's code filter passes both, the
    gateway keeps only the tag asked for."""
    cluster = records_cluster
    cluster.create_topic("T_records_tags", queues=1)
    tags = ["Aa", "BB", "C", "Aa", "BB", "D"]
    produce(cluster, "T_records_tags", [(f"m{i}".encode(), tag) for i, tag in enumerate(tags)])
    stub = cluster.gateway.stub
    request = pull("T_records_tags", expression="Aa || D", encoding=RECORDS)
    answer = stub.Pull(request, timeout=RPC_TIMEOUT_S)
    assert answer.status == Status.FOUND and answer.next_offset == len(tags)
    assert [(body, tag) for body, _, _, _, tag in decoded(answer)] == [
        (b"m0", "Aa"),
        (b"m3", "Aa"),
        (b"m5", "D"),
    ]
    only_bb = stub.Pull(pull("T_records_tags", 2, expression="BB", encoding=RECORDS), timeout=5)
    assert [body for body, *_ in decoded(only_bb)] == [b"m4"]
    none = stub.Pull(pull("T_records_tags", 5, expression="Aa", encoding=RECORDS), timeout=5)
    assert (none.status, none.next_offset, none.record_count) == (Status.NO_MATCHED_MESSAGE, 6, 0)


def test_records_pull_stops_at_max_pull_bytes(records_cluster: Cluster) -> None:
    cluster = records_cluster
    cluster.create_topic("T_records_bytes", queues=1)
    produce(cluster, "T_records_bytes", [(bytes(300), "")] * 20)
    stub = cluster.gateway.stub
    answer = stub.Pull(pull("T_records_bytes", encoding=RECORDS, max_messages=20), timeout=5)
    size = decode_record(answer.records, 0, len(answer.records)).total_size
    sizes = [size] * answer.record_count
    assert 1 <= answer.record_count < 20
    assert sum(sizes) == len(answer.records) <= MAX_PULL_BYTES
    assert len(answer.records) + sizes[0] > MAX_PULL_BYTES  # one more would not fit
    assert answer.next_offset == answer.record_count
    rest = stub.Pull(pull("T_records_bytes", answer.next_offset, encoding=RECORDS), timeout=5)
    assert decoded(rest)[0][2] == answer.next_offset


def test_messages_pull_stops_at_max_pull_bytes(records_cluster: Cluster) -> None:
    """The decoded pull is cut at --max-pull-bytes the same way (by the dispatch)."""
    cluster = records_cluster
    cluster.create_topic("T_messages_bytes", queues=1)
    produce(cluster, "T_messages_bytes", [(bytes(300), "")] * 20)
    stub = cluster.gateway.stub
    answer = stub.Pull(pull("T_messages_bytes", max_messages=20), timeout=RPC_TIMEOUT_S)
    sizes = [m.size for m in answer.messages]
    assert 1 <= len(sizes) < 20 and answer.next_offset == len(sizes)
    assert sum(sizes) <= MAX_PULL_BYTES < sum(sizes) + sizes[0]  # one more would not fit
    records = stub.Pull(
        pull("T_messages_bytes", max_messages=20, encoding=RECORDS), timeout=RPC_TIMEOUT_S
    )
    assert (records.record_count, records.next_offset) == (len(sizes), answer.next_offset)


def test_records_long_poll_wakes_on_arrival(records_cluster: Cluster) -> None:
    cluster = records_cluster
    cluster.create_topic("T_records_poll", queues=1)
    produce(cluster, "T_records_poll", [(b"first", "")])
    stub = cluster.gateway.stub
    request = pull("T_records_poll", 1, encoding=RECORDS, long_poll_timeout_ms=20_000)
    held = stub.Pull.future(request, timeout=30)
    cluster.gateway.wait_held(1)
    assert not held.done()
    started = time.monotonic()
    produce(cluster, "T_records_poll", [(b"late", "")])
    answer = held.result()
    assert answer.status == Status.FOUND and [b for b, *_ in decoded(answer)] == [b"late"]
    assert time.monotonic() - started < 5


def test_unknown_encoding_is_invalid(records_cluster: Cluster) -> None:
    records_cluster.create_topic("T_records_bad", queues=1)
    stub = records_cluster.gateway.stub
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: stub.Pull(pull("T_records_bad", encoding=7), timeout=RPC_TIMEOUT_S),
        "encoding 7",
        "ENCODING_RECORDS",
    )


HOST = pack_host(parse_host("127.0.0.1:10911"))


def stored(body: bytes, tags: str) -> bytes:
    """A record as the commitlog holds it (offsets left zero: the gateway reads tags)."""
    properties = encode_properties({TAGS: tags}) if tags else b""
    return encode_record("T", b"T", 0, body, properties, 0, 0, 1, HOST, HOST).data


def test_found_records_skips_spans_not_found() -> None:
    one, two = stored(b"a", ""), stored(b"bb", "")
    spans = [
        storage_pb.RecordSpan(physical_offset=0, size=len(one), count=1),
        storage_pb.RecordSpan(physical_offset=500, size=99, count=3),
        storage_pb.RecordSpan(physical_offset=900, size=len(two), count=1),
    ]
    read = storage_pb.ReadResponse(
        span_statuses=[storage_pb.FOUND, storage_pb.OFFSET_BELOW_MIN, storage_pb.FOUND],
        records=one + two,
    )
    assert found_records(spans, read) == (one + two, 2)


def test_found_records_rejects_an_answer_that_does_not_fit() -> None:
    spans = [storage_pb.RecordSpan(physical_offset=0, size=10, count=1)]
    with pytest.raises(SpanReadMismatch, match="0 span statuses for 1 spans"):
        found_records(spans, storage_pb.ReadResponse())
    short = storage_pb.ReadResponse(span_statuses=[storage_pb.FOUND], records=bytes(9))
    with pytest.raises(SpanReadMismatch, match="9 bytes of records for found spans of 10"):
        found_records(spans, short)


def test_matching_records_keeps_exact_tags_in_order() -> None:
    parts = [stored(b"1", "A"), stored(b"2", ""), stored(b"3", "B"), stored(b"4", "A")]
    kept, count = matching_records(b"".join(parts), 4, lambda tags: tags == "A")
    assert (kept, count) == (parts[0] + parts[3], 2)
    everything, total = matching_records(b"".join(parts), 4, lambda tags: True)
    assert (everything, total) == (b"".join(parts), 4)


def test_cached_records_are_the_spans_bytes() -> None:
    one, two = stored(b"a", ""), stored(b"bb", "")
    spans = [
        storage_pb.RecordSpan(physical_offset=0, size=len(one), count=1),
        storage_pb.RecordSpan(physical_offset=900, size=len(two), count=1),
    ]
    assert cached_records(spans, one + two) == (one + two, 2)
    with pytest.raises(SpanReadMismatch, match=f"answered {len(one)} bytes for spans of"):
        cached_records(spans, one)
