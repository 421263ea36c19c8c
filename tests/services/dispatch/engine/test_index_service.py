"""IndexService: index files on disk, rolls, queries, truncation and retention."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.dispatch.engine.index_service import (
    MAX_QUERY_COUNT,
    NO_OFFSET,
    TMP_FILE_NAME,
    IndexService,
)
from tide.format import (
    SYSFLAG_TRANSACTION_COMMIT,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
    IndexEntry,
    IndexGeometry,
    IndexHeader,
    index_file_name,
    index_key_hash,
    init_index_header,
    java_string_hashcode,
    read_slot,
    slot_for,
    unpack_index_entry,
    unpack_index_header,
)

TINY = IndexGeometry(slot_count=4, max_entries=8)  # 7 entries a file
T0 = 1_700_000_000_000
FAR_PAST, FAR_FUTURE = 0, 2**62
TOPIC = "TopicTest"


class FakeClock:
    def __init__(self, ms: int = T0) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def svc(tmp_path: Path, clock: FakeClock) -> Iterator[IndexService]:
    service = IndexService(tmp_path, TINY, clock)
    service.load()
    yield service
    service.close()


def index_files(root: Path) -> list[Path]:
    return sorted((root / "index").iterdir())


def put(svc: IndexService, offset: int, *keys: str, ts: int = T0, uniq: str | None = None) -> int:
    return svc.build(offset, ts, TOPIC, list(keys), uniq, 0)


def query(svc: IndexService, key: str, max_count: int = 100, begin: int = FAR_PAST) -> list[int]:
    return svc.query(TOPIC, key, max_count, begin, FAR_FUTURE)


def entry(data: bytes, geometry: IndexGeometry, number: int) -> IndexEntry:
    return unpack_index_entry(data, geometry.entry_position(number))


# -- bytes on disk -------------------------------------------------------------------


def test_worked_example_of_docs_byte_for_byte(tmp_path: Path, clock: FakeClock) -> None:
    geometry = IndexGeometry(slot_count=4, max_entries=4)
    svc = IndexService(tmp_path, geometry, clock)
    svc.load()
    assert put(svc, 5000, "k1", ts=T0) == 1
    assert put(svc, 5115, "k2", ts=T0 + 1500) == 1
    assert put(svc, 5230, "k5", ts=T0 + 3000) == 1
    svc.close()
    [path] = index_files(tmp_path)
    assert path.name == index_file_name(T0)
    expected = bytes.fromhex(
        "0000018BCFE56800 0000018BCFE573B8 0000000000001388 000000000000146E"
        "00000002 00000004"
        "00000003 00000002 00000000 00000000"
        + "00"
        * 20
        + "0029E6A8 0000000000001388 00000000 00000000"
        "0029E6A9 00000000000013FB 00000001 00000000"
        "0029E6AC 000000000000146E 00000003 00000001"
    )
    assert path.read_bytes() == expected
    assert len(expected) == geometry.file_bytes == 136


def test_first_file_header_slots_and_entries(svc: IndexService, tmp_path: Path) -> None:
    assert put(svc, 100, "a", "b", ts=T0) == 2
    assert put(svc, 250, "e", ts=T0 + 2999) == 1
    [path] = index_files(tmp_path)
    data = path.read_bytes()
    assert len(data) == TINY.file_bytes
    header = unpack_index_header(data)
    assert header[:4] == (T0, T0 + 2999, 100, 250)
    assert header.index_count == 4
    assert struct.unpack_from(">qqqqii", data, 0) == tuple(header)
    keys = ["a", "b", "e"]  # e shares a slot with a
    hashes = [index_key_hash(f"{TOPIC}#{k}") for k in keys]
    newest_of_slot: dict[int, int] = {}  # slot -> number of its newest entry
    rows = zip(hashes, [100, 100, 250], [0, 0, 2], strict=True)
    for number, (h, offset, diff) in enumerate(rows, 1):
        slot = slot_for(h, TINY.slot_count)
        prev = newest_of_slot.get(slot, 0)
        assert entry(data, TINY, number) == IndexEntry(h, offset, diff, prev)
        newest_of_slot[slot] = number
    for slot in range(TINY.slot_count):
        assert read_slot(data, TINY, slot) == newest_of_slot.get(slot, 0)
        raw = struct.unpack_from(">i", data, 40 + 4 * slot)[0]
        assert raw == newest_of_slot.get(slot, 0)
    assert header.hash_slot_count == len(newest_of_slot)
    assert data[TINY.entry_position(0) : TINY.entry_position(1)] == bytes(20)
    assert data[TINY.entry_position(4) :] == bytes(TINY.file_bytes - TINY.entry_position(4))


def test_uniq_key_first_then_keys_as_topic_hash_key(svc: IndexService, tmp_path: Path) -> None:
    assert put(svc, 7, "k1", "", "k2", uniq="UNIQ-1") == 3  # the empty key is skipped
    data = index_files(tmp_path)[0].read_bytes()
    stored = [entry(data, TINY, n).key_hash for n in (1, 2, 3)]
    assert stored == [index_key_hash(f"{TOPIC}#{k}") for k in ("UNIQ-1", "k1", "k2")]
    for key in ("UNIQ-1", "k1", "k2"):
        assert query(svc, key) == [7]
    assert svc.query("OtherTopic", "k1", 10, FAR_PAST, FAR_FUTURE) == []
    assert query(svc, "k3") == []


def test_rollback_records_are_skipped(svc: IndexService, tmp_path: Path) -> None:
    assert svc.build(10, T0, TOPIC, ["k"], "u", SYSFLAG_TRANSACTION_ROLLBACK) == 0
    assert index_files(tmp_path) == []
    assert svc.build(20, T0, TOPIC, ["k"], None, SYSFLAG_TRANSACTION_PREPARED) == 1
    assert svc.build(30, T0, TOPIC, ["k"], None, SYSFLAG_TRANSACTION_COMMIT) == 1
    assert svc.build(40, T0, TOPIC, ["k"], None, SYSFLAG_TRANSACTION_ROLLBACK | 1) == 0
    assert query(svc, "k") == [30, 20]


def test_redispatch_of_indexed_records_is_a_no_op(svc: IndexService, tmp_path: Path) -> None:
    assert put(svc, 0, "k", uniq="u0") == 2  # offset 0 is a real record
    assert put(svc, 100, "k", uniq="u1") == 2
    before = index_files(tmp_path)[0].read_bytes()
    for offset in (0, 50, 100):
        assert put(svc, offset, "k", uniq="again") == 0
    assert index_files(tmp_path)[0].read_bytes() == before
    assert svc.last_indexed_offset() == 100
    assert put(svc, 101, "k") == 1
    assert query(svc, "k") == [101, 100, 0]


# -- rolling -------------------------------------------------------------------------


def test_full_file_rolls_to_a_new_one(svc: IndexService, tmp_path: Path, clock: FakeClock) -> None:
    for i in range(7):
        assert put(svc, 100 * (i + 1), "k", ts=T0 + i * 1000) == 1
    clock.ms = T0 + 60_000
    assert put(svc, 800, "k", "other", ts=T0 + 11_000) == 2
    first, second = index_files(tmp_path)
    assert [first.name, second.name] == [index_file_name(T0), index_file_name(T0 + 60_000)]
    old = unpack_index_header(first.read_bytes())
    assert old == IndexHeader(T0, T0 + 6000, 100, 700, 1, 8)
    data = second.read_bytes()
    assert unpack_index_header(data) == IndexHeader(T0 + 11_000, T0 + 11_000, 800, 800, 2, 3)
    # The first entry's time is counted from the header copied from the full file (its
    # end timestamp T0 + 6000), as RocketMQ computes it before setting the begin time.
    assert entry(data, TINY, 1) == IndexEntry(index_key_hash(f"{TOPIC}#k"), 800, 5, 0)
    assert entry(data, TINY, 2).time_diff_s == 0
    assert query(svc, "k") == [800, 700, 600, 500, 400, 300, 200, 100]
    # 800 under "k" reads as T0 + 16,000 (begin + 5 s), outside its file's time range,
    # so a query of that time does not look into the file (RocketMQ's isTimeMatched).
    assert svc.query(TOPIC, "k", 10, T0 + 15_000, T0 + 17_000) == []
    assert svc.query(TOPIC, "other", 10, T0 + 11_000, T0 + 11_000) == [800]
    status = svc.status()
    assert (status.files, status.entries, status.last_indexed_offset) == (2, 9, 800)
    assert status.last_timestamp_ms == T0 + 11_000


def test_a_record_split_over_two_files(svc: IndexService, tmp_path: Path) -> None:
    for i in range(6):
        put(svc, i + 1, f"k{i}")
    assert put(svc, 50, "x", "y", "z", ts=T0 + 500) == 3
    first, second = (unpack_index_header(p.read_bytes()) for p in index_files(tmp_path))
    assert (first.end_phy_offset, first.index_count) == (50, 8)
    assert (second.begin_phy_offset, second.end_phy_offset, second.index_count) == (50, 50, 3)
    for key in "xyz":
        assert query(svc, key) == [50]


def test_same_millisecond_names_are_bumped_not_overwritten(
    svc: IndexService, tmp_path: Path, clock: FakeClock
) -> None:
    for i in range(7 * 3):
        put(svc, i + 1, f"k{i}")
    names = [p.name for p in index_files(tmp_path)]
    assert names == [index_file_name(T0 + i) for i in range(3)]
    clock.ms = T0 - 3_600_000  # the clock went back: names still go forward
    put(svc, 100, "late")
    assert index_files(tmp_path)[-1].name == index_file_name(T0 + 3)
    assert query(svc, "k0") == [1]
    assert query(svc, "late") == [100]


def test_file_count_limit(tmp_path: Path, clock: FakeClock) -> None:
    svc = IndexService(tmp_path, TINY, clock, max_files=2)
    svc.load()
    for i in range(14):
        put(svc, i + 1, "k")
    with pytest.raises(RuntimeError, match="limit 2"):
        put(svc, 15, "k")
    assert len(index_files(tmp_path)) == 2
    svc.close()
    with pytest.raises(ValueError, match="max_files"):
        IndexService(tmp_path, TINY, clock, max_files=10_001)


# -- queries -------------------------------------------------------------------------


def two_files_an_hour_apart(svc: IndexService, clock: FakeClock) -> None:
    for i in range(7):
        put(svc, i + 1, "k", ts=T0 + i * 1000)
    clock.ms = T0 + 3_600_000
    for i in range(7):
        put(svc, 100 + i, "k", ts=T0 + 3_600_000 + i * 1000)


def test_time_range_selects_files(svc: IndexService, clock: FakeClock) -> None:
    two_files_an_hour_apart(svc, clock)
    late = [106, 105, 104, 103, 102, 101]  # 100's time reads late (see the roll test)
    assert svc.query(TOPIC, "k", 100, T0 + 3_000_000, FAR_FUTURE) == [*late, 100]
    assert svc.query(TOPIC, "k", 100, T0, T0 + 6000) == [7, 6, 5, 4, 3, 2, 1]
    assert svc.query(TOPIC, "k", 100, T0 + 3000, T0 + 4000) == [5, 4]
    assert svc.query(TOPIC, "k", 100, T0 + 10_000, T0 + 20_000) == []
    assert svc.query(TOPIC, "k", 100, T0, FAR_FUTURE) == [*late, 100, 7, 6, 5, 4, 3, 2, 1]


def test_walk_stops_at_a_file_beginning_before_the_range(svc: IndexService) -> None:
    for i in range(1, 8):
        put(svc, i, "k", ts=T0 + 10_000_000)
    for i in range(11, 14):
        put(svc, i, "k", ts=T0)  # the store clock went back
    assert query(svc, "k") == [13, 12, 11, 7, 6, 5, 4, 3, 2, 1]
    # As RocketMQ's queryOffset: the newest file begins before the range, older files are
    # not read even though their entries are inside it.
    assert svc.query(TOPIC, "k", 100, T0 + 5_000_000, FAR_FUTURE) == []


def test_max_count_bounds_results(svc: IndexService, clock: FakeClock) -> None:
    two_files_an_hour_apart(svc, clock)
    assert query(svc, "k", max_count=3) == [106, 105, 104]
    assert query(svc, "k", max_count=9) == [106, 105, 104, 103, 102, 101, 100, 7, 6]
    assert len(query(svc, "k", max_count=MAX_QUERY_COUNT)) == 14
    for bad in (0, MAX_QUERY_COUNT + 1):
        with pytest.raises(ValueError, match="max_count"):
            query(svc, "k", max_count=bad)
    with pytest.raises(ValueError, match="empty"):
        svc.query(TOPIC, "k", 1, T0 + 1, T0)
    with pytest.raises(ValueError, match="key"):
        query(svc, "")


def test_hash_collisions_return_every_candidate(svc: IndexService) -> None:
    assert java_string_hashcode("Aa") == java_string_hashcode("BB")
    put(svc, 10, "Aa")
    put(svc, 20, "BB")
    put(svc, 30, "Ab")
    # Only the hash is stored: both are candidates, the caller checks each message's keys.
    assert query(svc, "Aa") == [20, 10]
    assert query(svc, "BB") == [20, 10]
    assert query(svc, "Ab") == [30]


# -- truncation and retention --------------------------------------------------------


def three_files(svc: IndexService, clock: FakeClock) -> None:
    """Entries at 1..7, 11..17 and 21..23, one file each."""
    for base in (0, 10, 20):
        clock.ms += 1000
        for i in range(1, 8 if base < 20 else 4):
            put(svc, base + i, "k", ts=clock.ms)


def test_truncate_past_deletes_newest_files(
    svc: IndexService, tmp_path: Path, clock: FakeClock
) -> None:
    three_files(svc, clock)
    names = [p.name for p in index_files(tmp_path)]
    assert len(names) == 3
    assert svc.truncate_past(24) == 23  # nothing at or past 24
    assert len(index_files(tmp_path)) == 3
    assert svc.truncate_past(23) == 17  # the file holding 23 goes
    assert svc.truncate_past(15) == 7
    assert [p.name for p in index_files(tmp_path)] == names[:1]
    assert query(svc, "k") == [7, 6, 5, 4, 3, 2, 1]
    assert put(svc, 7, "k") == 0  # still indexed
    assert put(svc, 11, "k") == 1  # re-dispatch after the returned offset
    assert query(svc, "k")[:2] == [11, 7]
    assert svc.truncate_past(0) == NO_OFFSET
    assert index_files(tmp_path) == []
    assert query(svc, "k") == []
    assert put(svc, 1, "k") == 1


def test_truncate_past_in_a_gap_between_files(svc: IndexService, tmp_path: Path) -> None:
    for i in range(1, 8):
        put(svc, i, "k")
    assert put(svc, 9, "k") == 1
    assert svc.truncate_past(8) == 7
    [only] = index_files(tmp_path)
    assert unpack_index_header(only.read_bytes()).end_phy_offset == 7


def test_load_an_empty_file_continuing_a_full_one(tmp_path: Path, clock: FakeClock) -> None:
    """RocketMQ creates the next file before putting into it: a crash leaves it empty,
    carrying the full file's end values, which still say what was indexed."""
    svc = IndexService(tmp_path, TINY, clock)
    svc.load()
    for i in range(1, 8):
        put(svc, i, "k", ts=T0 + 4000)
    svc.close()
    fresh = bytearray(TINY.file_bytes)
    init_index_header(fresh, 7, T0 + 4000)
    (tmp_path / "index" / index_file_name(T0 + 1)).write_bytes(fresh)
    again = IndexService(tmp_path, TINY, clock)
    again.load()
    assert again.last_indexed_offset() == 7
    assert again.delete_below(8) == 1  # only the empty file is left: it still knows
    assert again.last_indexed_offset() == 7
    assert put(again, 7, "k") == 0
    assert put(again, 8, "k") == 1
    assert [p.name for p in index_files(tmp_path)] == [index_file_name(T0 + 1)]
    assert query(again, "k") == [8]
    again.close()


def test_delete_below_keeps_the_newest(svc: IndexService, tmp_path: Path, clock: FakeClock) -> None:
    three_files(svc, clock)
    names = [p.name for p in index_files(tmp_path)]
    assert svc.delete_below(7) == 0  # the first file ends at 7: still needed
    assert svc.delete_below(8) == 1
    assert [p.name for p in index_files(tmp_path)] == names[1:]
    assert svc.delete_below(1000) == 1
    assert [p.name for p in index_files(tmp_path)] == names[2:]
    assert query(svc, "k") == [23, 22, 21]
    assert svc.status().files == 1


def test_delete_while_a_query_holds_the_file(svc: IndexService, clock: FakeClock) -> None:
    three_files(svc, clock)
    started, finish = threading.Event(), threading.Event()
    results: list[list[int]] = []
    real_release = svc._files[0].mf.release  # the oldest file, read last by a query

    def slow_release() -> None:
        started.set()
        assert finish.wait(5)
        real_release()

    svc._files[0].mf.release = slow_release  # type: ignore[method-assign]
    reader = threading.Thread(target=lambda: results.append(query(svc, "k")))
    reader.start()
    assert started.wait(5)
    path = svc._files[0].mf.path
    assert svc.delete_below(8) == 1
    assert not path.exists()  # unlinked at once
    assert svc.status().pending_destroys == 1  # unmapped once the reader lets go
    finish.set()
    reader.join(5)
    assert results[0][-7:] == [7, 6, 5, 4, 3, 2, 1]
    put(svc, 100, "k")  # the writer reaps
    assert svc.status().pending_destroys == 0


# -- lifecycle -----------------------------------------------------------------------


def test_reopen_loads_everything(tmp_path: Path, clock: FakeClock) -> None:
    svc = IndexService(tmp_path, TINY, clock)
    svc.load()
    three_files(svc, clock)
    put(svc, 30, "x", uniq="U")
    before = (query(svc, "k"), query(svc, "x"), query(svc, "U"), svc.status())
    svc.close()
    names = [p.name for p in index_files(tmp_path)]
    again = IndexService(tmp_path, TINY, clock)
    again.load()
    assert (query(again, "k"), query(again, "x"), query(again, "U"), again.status()) == before
    assert put(again, 30, "y") == 0
    assert put(again, 31, "y") == 1  # appended to the newest file, not full yet
    assert [p.name for p in index_files(tmp_path)] == names
    again.close()


def test_flush_syncs_only_dirty_files(svc: IndexService, clock: FakeClock) -> None:
    assert svc.flush() == 0
    put(svc, 1, "k")
    assert svc.flush() == 1
    assert svc.flush() == 0
    for i in range(2, 10):
        put(svc, i, "k")
    assert svc.flush() == 2  # the full file and the new one


def test_load_refuses_bad_files(tmp_path: Path, clock: FakeClock) -> None:
    directory = tmp_path / "index"
    directory.mkdir()
    (directory / TMP_FILE_NAME).write_bytes(b"half")
    bad = directory / index_file_name(T0)
    bad.write_bytes(bytes(TINY.file_bytes - 1))
    with pytest.raises(ValueError, match=bad.name):
        IndexService(tmp_path, TINY, clock).load()
    assert not (directory / TMP_FILE_NAME).exists()  # a stale tmp file is removed
    bad.write_bytes(bytes(TINY.file_bytes))
    stray = directory / "notes.txt"
    stray.write_text("x")
    with pytest.raises(ValueError, match=r"notes\.txt"):
        IndexService(tmp_path, TINY, clock).load()
    stray.unlink()
    svc = IndexService(tmp_path, TINY, clock)
    svc.load()
    assert svc.last_indexed_offset() == NO_OFFSET
    assert put(svc, 0, "k") == 1  # the fresh loaded file takes it
    assert [p.name for p in index_files(tmp_path)] == [bad.name]
    svc.close()


def test_load_refuses_offsets_going_back(tmp_path: Path, clock: FakeClock) -> None:
    svc = IndexService(tmp_path, TINY, clock)
    svc.load()
    for i in range(1, 9):
        put(svc, i, "k")
    svc.close()
    _, second = index_files(tmp_path)
    header = struct.pack(">qqqqii", T0, T0, 1, 1, 1, 2)  # ends at 1, before the first's 7
    second.write_bytes(header + second.read_bytes()[len(header) :])
    with pytest.raises(ValueError, match=second.name):
        IndexService(tmp_path, TINY, clock).load()


def test_calls_need_a_loaded_open_service(tmp_path: Path, clock: FakeClock) -> None:
    svc = IndexService(tmp_path, TINY, clock)
    with pytest.raises(RuntimeError, match="not loaded"):
        put(svc, 1, "k")
    svc.load()
    with pytest.raises(RuntimeError, match="already loaded"):
        svc.load()
    svc.close()
    with pytest.raises(RuntimeError, match="closed"):
        put(svc, 1, "k")


def test_concurrent_queries_while_writing(svc: IndexService) -> None:
    errors: list[BaseException] = []
    queries: list[int] = []
    stop = threading.Event()

    def reader() -> None:
        try:
            while not stop.is_set():
                found = query(svc, "k", max_count=1000)
                assert found == sorted(found, reverse=True)
                queries.append(len(found))
                time.sleep(0.0002)  # let the writer have the GIL
        except BaseException as exc:
            errors.append(exc)
            raise

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(1, 200):
        put(svc, i, "k")
        if i % 50 == 0:
            svc.delete_below(i - 20)
    stop.set()
    for t in threads:
        t.join(5)
    assert errors == []
    assert queries, "the readers never ran"
    assert query(svc, "k", max_count=5) == [199, 198, 197, 196, 195]
