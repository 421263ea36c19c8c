"""MessageStore.put_run: a producer's record run is checked whole, then appended like
any batch (the same bytes on disk as MessageStore.put of the same messages)."""

from __future__ import annotations

import struct

import pytest

from services.storage.engine.errors import (
    InvalidMessageError,
    NotWritableError,
    TopicNotFoundError,
)
from services.storage.engine.topic_table import TopicConfig
from tests.services.storage.engine.conftest import (
    SEGMENT_BYTES,
    StoreFactory,
    fill_segment,
    msg,
    read_records,
)
from tide.format import (
    SYSFLAG_TRANSACTION_PREPARED,
    HostAddress,
    RunWriter,
    encode_properties,
    pack_host,
)

BORN = pack_host(HostAddress("10.1.2.3", 4444))


def run(
    *records: tuple[str, int],
    body: bytes = b"body",
    sys_flag: int = 0,
    born: bytes = BORN,
    props: dict[str, str] | None = None,
) -> bytes:
    writer = RunWriter(born)
    for topic, queue_id in records:
        properties = encode_properties(props or {"UNIQ_KEY": "K"})
        writer.add(topic, topic.encode(), queue_id, body, properties, 3, sys_flag, 1_000)
    return writer.getvalue()


def test_a_run_lands_as_the_same_records_put_would_write(make_store: StoreFactory) -> None:
    store = make_store(store_host="10.9.9.9:10911")
    store.topics.ensure("T", 4)
    batch = store.put_run([run(("T", 1), ("T", 1), ("T", 2))]).batch
    assert batch.queue_offsets == [0, 1, 0]
    assert batch.physical_offsets == [0, batch.sizes[0], batch.sizes[0] + batch.sizes[1]]
    put = store.put(
        [msg("T", 1, b"body", properties={"UNIQ_KEY": "K"}, flag=3, born_timestamp_ms=1_000,
             born_host="10.1.2.3:4444")]
    ).batch  # fmt: skip
    records = read_records(store)
    assert [r.queue_offset for r in records] == [0, 1, 0, 2]
    for record in records:
        assert str(record.store_host) == "10.9.9.9:10911"
        assert record.store_timestamp_ms >= 1
        assert str(record.born_host) == "10.1.2.3:4444"
    # The run's record and put's record differ only where the store's fields differ.
    first, last = records[1], records[3]
    assert (first.body, first.properties, first.flag) == (last.body, last.properties, last.flag)
    assert put.sizes == [batch.sizes[0]]


def test_several_runs_append_as_one_batch_in_order(make_store: StoreFactory) -> None:
    store = make_store()
    store.topics.ensure("T", 2)
    batch = store.put_run([run(("T", 0)), run(("T", 0), ("T", 0))]).batch
    assert batch.queue_offsets == [0, 1, 2]


def test_unknown_topic_is_not_found_and_nothing_is_written(make_store: StoreFactory) -> None:
    store = make_store(auto_create_topics=False)
    store.topics.ensure("T", 2)
    with pytest.raises(TopicNotFoundError, match="'Nope' does not exist"):
        store.put_run([run(("T", 0), ("Nope", 0))])
    assert store.status().max_offset == 0


def test_unknown_topic_is_created_when_auto_create_is_on(make_store: StoreFactory) -> None:
    store = make_store(auto_create_topics=True, default_queue_nums=3)
    store.put_run([run(("New", 2))])
    created = store.topics.get("New")
    assert created is not None and created.write_queue_nums == 3


def test_queue_id_outside_the_topic_names_the_record(make_store: StoreFactory) -> None:
    store = make_store()
    store.topics.ensure("T", 2)
    with pytest.raises(InvalidMessageError) as info:
        store.put_run([run(("T", 1), ("T", 2))])
    assert str(info.value) == (
        "records: record 1: queue_id 2 is outside the 2 write queues of topic 'T' (0..1)"
    )
    assert store.status().max_offset == 0


def test_bad_layout_is_invalid_and_nothing_is_written(make_store: StoreFactory) -> None:
    store = make_store()
    store.topics.ensure("T", 2)
    data = bytearray(run(("T", 0), ("T", 1)))
    data[-3] ^= 0x01  # inside the second record's properties: the length check still holds
    data[-100] ^= 0xFF  # the second record's header
    with pytest.raises(InvalidMessageError, match=r"^records: record 1 of the run"):
        store.put_run([bytes(data)])
    assert store.status().max_offset == 0


def test_invalid_topic_name_is_refused(make_store: StoreFactory) -> None:
    store = make_store(auto_create_topics=True)
    with pytest.raises(InvalidMessageError, match=r"^records: record 0: "):
        store.put_run([run(("../x", 0))])


def test_reserved_sys_flag_bits_are_refused(make_store: StoreFactory) -> None:
    store = make_store()
    store.topics.ensure("T", 2)
    data = bytearray(run(("T", 0)))
    struct.pack_into(">i", data, 36, 1 << 6)  # bit 6 (need unwrap) is the store's
    with pytest.raises(InvalidMessageError, match="sets bits reserved for the store"):
        store.put_run([bytes(data)])


def test_prepared_transaction_records_take_no_queue_offset(make_store: StoreFactory) -> None:
    store = make_store()
    store.topics.ensure("T", 2)
    batch = store.put_run([run(("T", 0), sys_flag=SYSFLAG_TRANSACTION_PREPARED)]).batch
    assert batch.queue_offsets == [0]
    assert store.put_run([run(("T", 0))]).batch.queue_offsets == [0]  # not advanced


def test_a_run_that_crosses_a_segment_end_rolls_with_a_blank_marker(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    store.topics.ensure("T", 1)
    fill_segment(store, leave_bytes=400)
    batch = store.put_run([run(("T", 0), ("T", 0), ("T", 0), body=b"x" * 60)]).batch
    size = batch.sizes[0]
    assert 2 * size + 8 <= 400 < 3 * size + 8
    start = batch.physical_offsets[0]
    assert batch.physical_offsets == [start, start + size, SEGMENT_BYTES]
    records = read_records(store)
    assert [r.physical_offset for r in records[-3:]] == batch.physical_offsets


def test_ipv6_born_host_records_are_stored(make_store: StoreFactory) -> None:
    store = make_store()
    store.topics.ensure("T", 1)
    born = pack_host(HostAddress("2001:db8::7", 5))
    store.put_run([run(("T", 0), born=born)])
    (record,) = read_records(store)
    assert str(record.born_host) == "[2001:db8::7]:5"
    assert str(record.store_host) == "127.0.0.1:10911"


def test_ipv6_store_host_re_encodes_the_records(make_store: StoreFactory) -> None:
    store = make_store(store_host="[2001:db8::1]:10911")
    store.topics.ensure("T", 1)
    store.put_run([run(("T", 0), ("T", 0), props={"TAGS": "A", "KEYS": "k1 k2"})])
    records = read_records(store)
    assert [str(r.store_host) for r in records] == ["[2001:db8::1]:10911"] * 2
    assert records[1].properties == {"TAGS": "A", "KEYS": "k1 k2"}
    assert (records[1].body, records[1].flag, records[1].queue_offset) == (b"body", 3, 1)


def test_a_slave_refuses_runs(make_store: StoreFactory) -> None:
    store = make_store()
    store.refuse_puts("a slave: produce to the master")
    with pytest.raises(NotWritableError, match="a slave"):
        store.put_run([run(("T", 0))])


def test_empty_records_are_refused(make_store: StoreFactory) -> None:
    store = make_store()
    with pytest.raises(InvalidMessageError, match="records is empty"):
        store.put_run([b""])


def test_a_topic_change_is_seen_by_the_next_run(make_store: StoreFactory) -> None:
    """put_run keeps its topic lookups between runs: each change of the topic table
    (fewer write queues, read-only, deleted, created again) reaches the next run."""
    store = make_store(auto_create_topics=False)
    store.topics.upsert(TopicConfig("T", 4, 4))
    store.put_run([run(("T", 3))])
    store.put_run([run(("T", 3))])  # from the kept lookup
    store.topics.upsert(TopicConfig("T", 4, 2))
    with pytest.raises(InvalidMessageError, match="outside the 2 write queues"):
        store.put_run([run(("T", 3))])
    store.put_run([run(("T", 1))])
    store.topics.upsert(TopicConfig("T", 4, 2, perm=4))
    with pytest.raises(NotWritableError, match="not writable"):
        store.put_run([run(("T", 1))])
    store.topics.upsert(TopicConfig("T", 4, 2))
    store.put_run([run(("T", 1))])
    store.topics.delete("T")
    with pytest.raises(TopicNotFoundError, match="'T' does not exist"):
        store.put_run([run(("T", 1))])
    store.topics.upsert(TopicConfig("T", 8, 8))
    assert store.put_run([run(("T", 7))]).batch.queue_offsets == [0]
