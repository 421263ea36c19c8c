"""DispatchStore: records in, consume queue entries + index out; progress; reconcile."""

from __future__ import annotations

import json
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from services.dispatch.engine.dispatch_store import (
    PROGRESS_FILE,
    Arrival,
    DispatchConfig,
    DispatchDivergedError,
    DispatchStore,
    _each_twice,
    _holds,
    _key_columns,
)
from tide.files import FileLockedError
from tide.format import (
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    HostAddress,
    _core,
    decode_record,
    encode_properties,
    encode_record,
    pack_host,
    patch_record,
    tags_code,
    write_blank,
)
from tide.tail import RecordAssembler, RecordAt, RecordBatch

HOST = pack_host(HostAddress("127.0.0.1", 10911))


@dataclass
class Msg:
    topic: str
    queue_id: int
    tags: str = ""
    keys: str = ""
    uniq: str = ""
    sys_flag: int = 0


class Log:
    """A commitlog byte stream with queue offsets assigned as the storage does."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.next_queue_offset: dict[tuple[str, int], int] = {}

    def add(self, msg: Msg, store_ms: int = 1_000) -> int:
        props = {
            k: v for k, v in (("TAGS", msg.tags), ("KEYS", msg.keys), ("UNIQ_KEY", msg.uniq)) if v
        }
        rec = encode_record(
            msg.topic,
            msg.topic.encode(),
            msg.queue_id,
            b"body",
            encode_properties(props),
            0,
            msg.sys_flag,
            1,
            HOST,
            HOST,
        )
        key = (msg.topic, msg.queue_id)
        queue_offset = 0
        if msg.sys_flag not in (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK):
            queue_offset = self.next_queue_offset.get(key, 0)
            self.next_queue_offset[key] = queue_offset + 1
        pos = len(self.data)
        self.data += rec.data
        patch_record(self.data, pos, rec.store_timestamp_pos, queue_offset, pos, store_ms)
        return pos

    def records(self, start: int = 0) -> list[RecordAt]:
        return RecordAssembler(start).feed(start, bytes(self.data[start:]))


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[DispatchStore]:
    store = DispatchStore(
        DispatchConfig(
            tmp_path / "d",
            entries_per_segment=8,
            index_slot_count=16,
            index_max_entries=64,
            flush_interval_ms=60_000,
        )
    )
    store.open()
    yield store
    store.close()


def _entries(store: DispatchStore, topic: str, queue_id: int) -> list[tuple[int, int, int]]:
    queue = store.consume_queues.find(topic, queue_id)
    assert queue is not None
    return [(e.commitlog_offset, e.size, e.tags_code) for e in queue.get(queue.min_offset, 100)]


def test_records_become_entries_index_and_arrivals(open_store: DispatchStore) -> None:
    log = Log()
    a0 = log.add(Msg("A", 0, tags="TagA", keys="k1 k2"))
    a1 = log.add(Msg("A", 0, tags="TagB", uniq="U1"))
    b0 = log.add(Msg("B", 3))
    arrivals = open_store.apply(log.records())
    assert sorted(arrivals, key=lambda a: a.topic) == [Arrival("A", 0, 2), Arrival("B", 3, 1)]
    sizes = {r.offset: r.size for r in log.records()}
    assert _entries(open_store, "A", 0) == [
        (a0, sizes[a0], tags_code("TagA")),
        (a1, sizes[a1], tags_code("TagB")),
    ]
    assert _entries(open_store, "B", 3) == [(b0, sizes[b0], 0)]
    assert open_store.index.query("A", "k2", 10, 0, 10**13) == [a0]
    assert open_store.index.query("A", "U1", 10, 0, 10**13) == [a1]
    assert open_store.dispatched_offset == len(log.data)


def test_transactions_prepared_indexed_rollback_skipped(open_store: DispatchStore) -> None:
    log = Log()
    prepared = log.add(Msg("T", 0, keys="p", sys_flag=SYSFLAG_TRANSACTION_PREPARED))
    log.add(Msg("T", 0, keys="r", sys_flag=SYSFLAG_TRANSACTION_ROLLBACK))
    assert open_store.apply(log.records()) == []
    assert open_store.consume_queues.find("T", 0) is None
    assert open_store.index.query("T", "p", 10, 0, 10**13) == [prepared]
    assert open_store.index.query("T", "r", 10, 0, 10**13) == []


def test_a_batch_of_rollbacks_alone_indexes_nothing(open_store: DispatchStore) -> None:
    """Every record of the batch with the same flag (the batch-wide check), rollbacks: no
    key indexed; then a batch of one flag, 0: its keys indexed."""
    log = Log()
    for key in ("r1", "r2", "r3"):
        log.add(Msg("T", 0, keys=key, uniq=f"U{key}", sys_flag=SYSFLAG_TRANSACTION_ROLLBACK))
    assert open_store.apply(log.records()) == []
    for key in ("r1", "r2", "r3", "Ur1"):
        assert open_store.index.query("T", key, 10, 0, 10**13) == []
    start = len(log.data)
    kept = [log.add(Msg("T", 1, keys=key, uniq=f"U{key}")) for key in ("k1", "k2")]
    open_store.apply(log.records(start))
    assert open_store.index.query("T", "k2", 10, 0, 10**13) == [kept[1]]
    assert open_store.index.query("T", "Uk1", 10, 0, 10**13) == [kept[0]]


def test_redispatch_is_idempotent(open_store: DispatchStore) -> None:
    log = Log()
    for i in range(20):
        log.add(Msg("A", i % 2, keys=f"k{i}"))
    open_store.apply(log.records())
    before = (_entries(open_store, "A", 0), _entries(open_store, "A", 1))
    entries_before = open_store.index.status().entries
    middle = log.records()[7].offset
    open_store.reconcile(0, len(log.data))  # resume from the durable offset (0)
    assert open_store.apply(log.records(middle)) == []
    assert open_store.apply(log.records()) == []
    assert (_entries(open_store, "A", 0), _entries(open_store, "A", 1)) == before
    assert open_store.index.status().entries == entries_before


def test_progress_is_written_by_flush_and_read_at_open(tmp_path: Path) -> None:
    config = DispatchConfig(
        tmp_path / "d",
        entries_per_segment=8,
        index_slot_count=16,
        index_max_entries=64,
        flush_interval_ms=60_000,
    )
    log = Log()
    for i in range(5):
        log.add(Msg("A", 0, keys=f"k{i}"))
    store = DispatchStore(config)
    store.open()
    store.apply(log.records())
    assert not (config.store_dir / PROGRESS_FILE).exists()
    store.flush(thorough=False)
    progress = json.loads((config.store_dir / PROGRESS_FILE).read_text())
    assert progress["dispatchedOffset"] == len(log.data)
    store.close()
    again = DispatchStore(config)
    again.open()
    try:
        assert again.status().durable_offset == len(log.data)
        assert again.reconcile(0, len(log.data)) == len(log.data)
    finally:
        again.close()


def test_reconcile_drops_entries_past_a_truncated_storage(open_store: DispatchStore) -> None:
    log = Log()
    offsets = [log.add(Msg("A", 0, keys=f"k{i}")) for i in range(6)]
    open_store.apply(log.records())
    open_store.flush(thorough=True)
    cut = offsets[4]  # the storage lost records 4 and 5
    # The only index file held entries past the cut, so it is deleted as a whole and the
    # records below the cut are dispatched again (from the start: nothing else indexed).
    resume = open_store.reconcile(0, cut)
    assert resume == 0
    assert [e[0] for e in _entries(open_store, "A", 0)] == offsets[:4]
    assert open_store.index.query("A", "k5", 10, 0, 10**13) == []
    assert open_store.apply(log.records()[:4]) == []  # entries kept; index rebuilt
    assert open_store.index.query("A", "k0", 10, 0, 10**13) == [offsets[0]]
    # The storage appends new records at the cut: they get the freed queue offsets.
    rewritten = Log()
    for i in range(4):
        rewritten.add(Msg("A", 0, keys=f"k{i}"))
    new = rewritten.add(Msg("A", 0, keys="new"))
    assert new == cut
    assert open_store.apply(rewritten.records(cut)) == [Arrival("A", 0, 5)]
    assert open_store.index.query("A", "new", 10, 0, 10**13) == [cut]


def test_empty_store_rebuilds_from_the_storage_min(open_store: DispatchStore) -> None:
    assert open_store.reconcile(4096, 9000) == 4096
    assert open_store.dispatched_offset == 4096


def test_second_store_on_the_same_dir_fails(open_store: DispatchStore, tmp_path: Path) -> None:
    with pytest.raises(FileLockedError, match="in use by another process"):
        DispatchStore(DispatchConfig(tmp_path / "d")).open()


def test_a_rewritten_commitlog_is_the_truth(open_store: DispatchStore) -> None:
    """The storage truncated a torn tail and appended other records at the same offsets
    while dispatch was away: re-dispatch meets a conflicting entry, drops its entries from
    there, and after reconciling follows the new records."""
    old = Log()
    offsets = [old.add(Msg("A", 0, keys=f"old{i}")) for i in range(6)]
    open_store.apply(old.records())
    open_store.flush(thorough=True)
    new = Log()
    for i in range(4):
        new.add(Msg("A", 0, keys=f"old{i}"))
    cut = offsets[4]
    for i in range(3):
        new.add(Msg("A", 0, tags="Other", keys=f"new{i}"))  # other sizes, same queue offsets
    assert open_store.reconcile(0, len(new.data)) == len(old.data)  # nothing looks wrong yet
    with pytest.raises(DispatchDivergedError) as caught:
        open_store.apply(new.records(cut))
    assert caught.value.offset == cut
    resume = open_store.reconcile(0, len(new.data))
    assert resume <= cut
    open_store.apply(new.records(resume))
    assert _entries(open_store, "A", 0) == [
        (r.offset, r.size, tags_code("Other" if r.offset >= cut else "")) for r in new.records()
    ]
    assert open_store.index.query("A", "old5", 10, 0, 10**13) == []
    assert open_store.index.query("A", "new2", 10, 0, 10**13) == [new.records()[-1].offset]


# -- a batch at a time: the same files as one record at a time -----------------------------


def _store(root: Path) -> DispatchStore:
    store = DispatchStore(
        DispatchConfig(
            root,
            entries_per_segment=8,
            index_slot_count=16,
            index_max_entries=24,  # index files roll inside batches
            flush_interval_ms=60_000,
        )
    )
    store.open()
    return store


def _files(root: Path) -> list[tuple[str, bytes]]:
    """Every consume queue file by path, and the index files in order (their names are
    creation times, different between two stores)."""
    queues = sorted(
        (str(p.relative_to(root)), p.read_bytes())
        for p in (root / "consumequeue").rglob("*")
        if p.is_file()
    )
    index = [("index", p.read_bytes()) for p in sorted((root / "index").iterdir())]
    return queues + index


def _mixed_log() -> Log:
    log = Log()
    rnd = random.Random(31)
    for i in range(90):
        sys_flag = rnd.choice(
            [0] * 8 + [SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK]
        )
        log.add(
            Msg(
                rnd.choice(["A", "B", "T-opic_2"]),
                rnd.randrange(3),
                tags=rnd.choice(["", "TagA", "标签"]),
                keys=rnd.choice(["", f"k{i}", f"k{i} k{i + 1}  x", "ключ"]),
                uniq=rnd.choice(["", f"U{i}"]),
                sys_flag=sys_flag,
            ),
            store_ms=1_000 + 700 * i,
        )
    return log


@pytest.mark.parametrize("split", [1, 7, 1000])
def test_a_batch_writes_what_records_one_by_one_write(tmp_path: Path, split: int) -> None:
    _check_batches_write_what_one_by_one_writes(tmp_path, _mixed_log(), split)


def _round_robin_log(keys: str, gap: bool) -> Log:
    """One topic, its 4 queues taking turns (a producer's round robin); ``keys``: "one"
    (KEYS on every record), "uniq" (UNIQ_KEY and KEYS on every record), "some";
    ``gap``: queue 1 skips queue offsets midway (PRE_BLANK padding, puts one by one)."""
    log = Log()
    for i in range(41):
        if gap and i == 21:
            log.next_queue_offset[("RR", 1)] += 3
        uniq = f"U{i}" if keys == "uniq" or (keys == "some" and i % 3 == 0) else ""
        key = f"k{i}" if keys != "some" or i % 2 else ""
        log.add(Msg("RR", i % 4, tags="TagA", keys=key, uniq=uniq), store_ms=1_000 + 300 * i)
    return log


@pytest.mark.parametrize("split", [1, 6, 1000])
@pytest.mark.parametrize(("keys", "gap"), [("one", False), ("uniq", False), ("some", True)])
def test_round_robin_batches_write_what_records_one_by_one_write(
    tmp_path: Path, split: int, keys: str, gap: bool
) -> None:
    """The queues taking turns: each queue's records are a slice of the batch."""
    _check_batches_write_what_one_by_one_writes(tmp_path, _round_robin_log(keys, gap), split)


def _blocks_log(gap: bool) -> Log:
    """One topic, produce requests of 5 records each to one queue (queues 2, 0, 3, 2, 1,
    ...: a queue again after others, or right after itself), as the gateway appends
    them; ``gap``: queue 3 skips queue offsets midway (puts one by one)."""
    log = Log()
    for request in range(9):
        queue_id = (2, 0, 3, 2, 1, 3, 0, 0, 2)[request]
        if gap and request == 5:
            log.next_queue_offset[("BL", 3)] += 2
        for i in range(5):
            n = 5 * request + i
            log.add(Msg("BL", queue_id, tags="TagA", keys=f"k{n}"), store_ms=1_000 + 50 * n)
    return log


@pytest.mark.parametrize("split", [1, 5, 7, 10, 15, 1000])
@pytest.mark.parametrize("gap", [False, True])
def test_blocks_of_one_queue_write_what_records_one_by_one_write(
    tmp_path: Path, split: int, gap: bool
) -> None:
    """Each queue's records back to back in a batch (or not, when a queue comes again
    after others): the same files and arrivals as one record at a time."""
    _check_batches_write_what_one_by_one_writes(tmp_path, _blocks_log(gap), split)


def _scanned_batch(log: Log, records: list[RecordAt]) -> RecordBatch:
    """``records`` (back to back) as the Tail's scan gives them: with the compiled core,
    integer columns as array('q') (from_records makes lists)."""
    start, end = records[0].offset, records[-1].end_offset
    batch = RecordAssembler(start).feed_batch(start, bytes(log.data[start:end]))
    if _core.ccore is not None:
        assert type(batch.offsets) is array and type(batch.queue_offsets) is array
    return batch


def _check_batches_write_what_one_by_one_writes(tmp_path: Path, log: Log, split: int) -> None:
    records = log.records()
    one, many = _store(tmp_path / "one"), _store(tmp_path / "many")
    scanned = _store(tmp_path / "scanned")
    try:
        arrivals_one = [a for rec in records for a in one.apply([rec])]
        arrivals_many: list[Arrival] = []
        arrivals_scanned: list[Arrival] = []
        for start in range(0, len(records), split):
            part = records[start : start + split]
            arrivals_many += many.apply(RecordBatch.from_records(part))
            arrivals_scanned += scanned.apply(_scanned_batch(log, part))
        # the last arrival of each queue is the same
        last_one = {(a.topic, a.queue_id): a.max_offset for a in arrivals_one}
        assert {(a.topic, a.queue_id): a.max_offset for a in arrivals_many} == last_one
        assert {(a.topic, a.queue_id): a.max_offset for a in arrivals_scanned} == last_one
        assert many.dispatched_offset == one.dispatched_offset == len(log.data)
        assert scanned.dispatched_offset == len(log.data)
        assert many._last_record == one._last_record == scanned._last_record
        assert many.index.status() == one.index.status() == scanned.index.status()
        for store in (one, many, scanned):
            store.flush(thorough=True)
        assert _files(tmp_path / "many") == _files(tmp_path / "one")
        assert _files(tmp_path / "scanned") == _files(tmp_path / "one")
        # and dispatching it all again changes nothing
        many.reconcile(0, len(log.data))
        assert many.apply(RecordAssembler(0).feed_batch(0, bytes(log.data))) == []
        many.flush(thorough=True)
        assert _files(tmp_path / "many") == _files(tmp_path / "one")
    finally:
        one.close()
        many.close()
        scanned.close()


def test_a_batch_from_the_assembler_is_dispatched(open_store: DispatchStore) -> None:
    log = _mixed_log()
    batch = RecordAssembler(0).feed_batch(0, bytes(log.data))
    open_store.apply(batch)
    assert open_store.dispatched_offset == len(log.data)
    for rec in log.records():
        if rec.scan.sys_flag == SYSFLAG_TRANSACTION_ROLLBACK:
            continue
        keys = decode_record(rec.data, 0, rec.size).properties.get("KEYS", "")
        for key in keys.split(" "):
            if key:
                assert rec.offset in open_store.index.query(rec.scan.topic, key, 64, 0, 10**13)


def test_a_query_meeting_a_batch_asks_again_under_the_lock(open_store: DispatchStore) -> None:
    log = Log()
    offset = log.add(Msg("A", 0, keys="k"))
    open_store.apply(log.records())
    index = open_store.index
    index._writes += 1  # as if a batch were being written
    try:
        assert index.query("A", "k", 10, 0, 10**13) == [offset]
    finally:
        index._writes += 1


def test_an_empty_uniq_key_is_indexed_in_a_batch_too(tmp_path: Path) -> None:
    log = Log()
    for i, props in enumerate([{"KEYS": "a"}, {"UNIQ_KEY": "", "KEYS": "b"}, {"KEYS": "c"}]):
        encoded = encode_record(
            "A", b"A", 0, b"body", encode_properties(props), 0, 0, 1, HOST, HOST
        )
        pos = len(log.data)
        log.data += encoded.data
        patch_record(log.data, pos, encoded.store_timestamp_pos, i, pos, 1_000)
    one, many = _store(tmp_path / "one"), _store(tmp_path / "many")
    try:
        for rec in log.records():
            one.apply([rec])
        many.apply(RecordAssembler(0).feed_batch(0, bytes(log.data)))
        assert many.index.status() == one.index.status()
        assert one.index.status().entries == 4  # a, then "A#" and b, then c
        one.flush(thorough=True)
        many.flush(thorough=True)
        assert _files(tmp_path / "many") == _files(tmp_path / "one")
    finally:
        one.close()
        many.close()


def test_a_batch_with_ipv6_records_and_a_segment_end(tmp_path: Path) -> None:
    """Records the batch scan leaves to the per-record path (IPv6 hosts) and a blank
    marker inside one chunk: a batch of several buffers, with a gap in the offsets."""
    host6 = pack_host(HostAddress("::1", 10911))
    data = bytearray()
    next_queue_offset = [0, 0]
    for i in range(30):
        if i == 17:  # the segment ends: a blank marker and its filler, 300 bytes
            blank = bytearray(300)
            write_blank(blank, 0, 300)
            data += blank
        v6 = i % 4 == 1
        queue_id = i % 2
        encoded = encode_record(
            "A",
            b"A",
            queue_id,
            b"body%d" % i,
            encode_properties({"TAGS": f"t{i % 3}", "KEYS": f"k{i} x{i}", "UNIQ_KEY": f"U{i}"}),
            0,
            SYSFLAG_BORN_HOST_V6 | SYSFLAG_STORE_HOST_V6 if v6 else 0,
            1,
            host6 if v6 else HOST,
            host6 if v6 else HOST,
        )
        pos = len(data)
        data += encoded.data
        patch_record(
            data, pos, encoded.store_timestamp_pos, next_queue_offset[queue_id], pos, 1_000 + i
        )
        next_queue_offset[queue_id] += 1
    stream = bytes(data)
    batch = RecordAssembler(0).feed_batch(0, stream)
    assert len(batch) == 30
    one, many = _store(tmp_path / "one"), _store(tmp_path / "many")
    try:
        for rec in batch.records():
            one.apply([rec])
        many.apply(batch)
        assert many.index.status() == one.index.status()
        assert many.index.query("A", "x29", 10, 0, 10**13) == [batch.offsets[29]]
        one.flush(thorough=True)
        many.flush(thorough=True)
        assert _files(tmp_path / "many") == _files(tmp_path / "one")
    finally:
        one.close()
        many.close()


def test_key_columns_tell_present_empty_and_missing_uniq_keys_apart() -> None:
    """UNIQ_KEY is a column when every record has one, even an empty value (b"" is a
    value, None is absent); none at all is no column; some is no columns (one by one)."""
    assert _key_columns([b"", b""], [b"u1", b"u2"]) == [[b"u1", b"u2"]]
    assert _key_columns([b"", b""], [b"u1", b""]) == [[b"u1", b""]]
    assert _key_columns([b"", b""], [None, None]) == []
    assert _key_columns([b"", b""], [b"u1", None]) is None
    assert _key_columns([b"", b""], [None, b""]) is None
    assert _key_columns([b"k1", b"k2"], [b"u1", b"u2"]) == [[b"u1", b"u2"], [b"k1", b"k2"]]
    # KEYS on some records only: no columns (one by one), whichever record has them.
    assert _key_columns([b"", b"k2"], [b"u1", b"u2"]) is None
    assert _key_columns([b"k1", b""], [None, None]) is None


def test_holds_answers_in_for_one_topic_and_for_many() -> None:
    schedule = "SCHEDULE_TOPIC_XXXX"
    assert _holds([schedule] * 3, schedule) and not _holds(["A"] * 3, schedule)
    assert _holds(["A", schedule, "A"], schedule) and not _holds(["A", "B"], schedule)
    # Equal topics that are distinct objects are one topic all the same.
    assert _holds(["".join(["SCHEDULE_TOPIC", "_XXXX"]), schedule], schedule)
    assert not _holds([], schedule)


def test_each_twice_keeps_the_column_kind() -> None:
    """The offsets and timestamps of records with two index keys (UNIQ_KEY and KEYS):
    each value twice, an array('q') from the compiled scan staying one."""
    for column in ([5, 7, 9], array("q", [5, 7, 9])):
        twice = _each_twice(column)
        assert type(twice) is type(column) and list(twice) == [5, 5, 7, 7, 9, 9]
    assert list(_each_twice(array("q"))) == [] == _each_twice([])
