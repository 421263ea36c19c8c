"""The index file: layout, IndexFile.putKey and IndexFile.selectPhyOffset, byte by byte."""

from __future__ import annotations

import mmap
import os
import random
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tide.format import (
    DEFAULT_INDEX_MAX_ENTRIES,
    DEFAULT_INDEX_SLOT_COUNT,
    INDEX_ENTRY_BYTES,
    INDEX_HEADER_BYTES,
    IndexEntry,
    IndexGeometry,
    IndexHeader,
    index_file_name,
    index_key,
    index_key_hash,
    index_key_hashes,
    index_time_matched,
    init_index_header,
    is_index_full,
    pack_index_entry,
    pack_index_header,
    parse_index_file_name,
    put_key,
    put_keys,
    read_index_header,
    read_slot,
    select_phy_offsets,
    slot_for,
    time_diff_seconds,
    unpack_index_entry,
    unpack_index_header,
)

T0 = 1_700_000_000_000
INT_MAX = 2**31 - 1
ALL_TIME = (0, 2**62)
G = IndexGeometry(slot_count=4, max_entries=8)
# Key hashes (see test_key_hashes_used_here): k1 and k5 share slot 0 of 4, k2 is in slot 1.
K1, K2, K5 = "TopicTest#k1", "TopicTest#k2", "TopicTest#k5"


def _fresh(geometry: IndexGeometry = G) -> bytearray:
    return bytearray(geometry.file_bytes)


def _entry(buf: bytearray, number: int, geometry: IndexGeometry = G) -> IndexEntry:
    return unpack_index_entry(buf, geometry.entry_position(number))


def _slot_of(key: str, geometry: IndexGeometry = G) -> int:
    return slot_for(index_key_hash(key), geometry.slot_count)


def _select(
    buf: bytearray, key: str, max_count: int = 64, span: tuple[int, int] = ALL_TIME
) -> list[int]:
    return select_phy_offsets(buf, G, key, max_count, span[0], span[1])


def test_key_hashes_used_here() -> None:
    assert [index_key_hash(k) for k in (K1, K2, K5)] == [2746024, 2746025, 2746028]
    assert [_slot_of(k) for k in (K1, K2, K5)] == [0, 1, 0]
    assert index_key_hash("T#Aa") == index_key_hash("T#BB")  # a true hash collision
    assert index_key("TopicTest", "k1") == K1


def test_default_geometry() -> None:
    g = IndexGeometry()
    assert (g.slot_count, g.max_entries) == (DEFAULT_INDEX_SLOT_COUNT, DEFAULT_INDEX_MAX_ENTRIES)
    assert g.file_bytes == 420_000_040
    assert g.slot_position(0) == 40
    assert g.slot_position(4_999_999) == 40 + 4 * 4_999_999
    assert g.entries_start == 20_000_040
    assert g.entry_position(1) == 20_000_060
    assert g.entry_position(19_999_999) + INDEX_ENTRY_BYTES == g.file_bytes
    assert g.capacity == 19_999_999


def test_small_geometry_and_limits() -> None:
    assert G.file_bytes == 40 + 4 * 4 + 8 * 20 == 216
    assert G.slot_position(3) == 52
    assert G.entry_position(0) == 56
    with pytest.raises(ValueError, match="slot count"):
        IndexGeometry(0, 8)
    with pytest.raises(ValueError, match="max entries"):
        IndexGeometry(4, 1)
    with pytest.raises(ValueError, match="2\\^31"):
        IndexGeometry(5_000_000, 107_000_000)  # Java computes the file size as an int


def test_header_and_entry_layout() -> None:
    header = IndexHeader(1, 2, 3, 4, 5, 6)
    data = pack_index_header(header)
    assert len(data) == INDEX_HEADER_BYTES
    assert data == struct.pack(">qqqqii", 1, 2, 3, 4, 5, 6)
    assert unpack_index_header(data) == header
    entry = pack_index_entry(0x01020304, 5_000, 7, 3)
    assert entry == bytes.fromhex("01020304 0000000000001388 00000007 00000003")
    assert unpack_index_entry(entry, 0) == IndexEntry(0x01020304, 5_000, 7, 3)


def test_fresh_file_reads_index_count_one() -> None:
    buf = _fresh()
    assert unpack_index_header(buf).index_count == 0
    assert read_index_header(buf) == IndexHeader(0, 0, 0, 0, 0, 1)
    assert _select(buf, K1) == []


def test_first_put_writes_entry_one_slot_and_header() -> None:
    buf = _fresh()
    assert put_key(buf, G, K1, 5_000, T0)
    assert unpack_index_header(buf) == IndexHeader(T0, T0, 5_000, 5_000, 1, 2)
    assert read_slot(buf, G, 0) == 1
    assert [read_slot(buf, G, s) for s in (1, 2, 3)] == [0, 0, 0]
    entries = G.entries_start
    assert buf[entries : entries + INDEX_ENTRY_BYTES] == bytes(INDEX_ENTRY_BYTES)  # number 0
    assert bytes(buf[G.entry_position(1) : G.entry_position(2)]) == pack_index_entry(
        2746024, 5_000, 0, 0
    )
    assert buf[G.entry_position(2) :] == bytes(G.file_bytes - G.entry_position(2))


def test_chain_in_one_slot_and_numbering() -> None:
    buf = _fresh()
    assert put_key(buf, G, K1, 100, T0)
    assert put_key(buf, G, K5, 200, T0 + 1_000)  # same slot as K1
    assert put_key(buf, G, K1, 300, T0 + 2_000)
    assert read_slot(buf, G, 0) == 3
    assert _entry(buf, 1) == IndexEntry(2746024, 100, 0, 0)
    assert _entry(buf, 2) == IndexEntry(2746028, 200, 1, 1)
    assert _entry(buf, 3) == IndexEntry(2746024, 300, 2, 2)
    header = unpack_index_header(buf)
    assert (header.hash_slot_count, header.index_count) == (1, 4)
    assert (header.begin_phy_offset, header.end_phy_offset) == (100, 300)
    assert (header.begin_timestamp_ms, header.end_timestamp_ms) == (T0, T0 + 2_000)
    # key_hash filtering: the shared chain holds both keys; each lookup keeps its own.
    assert _select(buf, K1) == [300, 100]
    assert _select(buf, K5) == [200]
    assert _select(buf, K2) == []  # empty slot


def test_a_walk_given_a_read_function_reads_only_through_it() -> None:
    """The dispatch's walk reads the file with pread (``read=MappedFile.read``): the
    buffer given is then only sized, and the walk reads the header, the key's slot and
    its chain's entries, each once."""
    buf = _fresh()
    put_key(buf, G, K1, 100, T0)
    put_key(buf, G, K5, 200, T0 + 1_000)  # same slot as K1: in K1's chain
    put_key(buf, G, K1, 300, T0 + 2_000)
    reads: list[tuple[int, int]] = []

    def read(position: int, size: int) -> bytes:
        reads.append((position, size))
        return bytes(buf[position : position + size])

    assert select_phy_offsets(_fresh(), G, K1, 64, *ALL_TIME, read=read) == [300, 100]
    assert reads == [
        (0, INDEX_HEADER_BYTES),
        (G.slot_position(0), 4),
        *((G.entry_position(n), INDEX_ENTRY_BYTES) for n in (3, 2, 1)),
    ]


def test_hash_slot_count_counts_slots_going_from_empty_to_used() -> None:
    buf = _fresh()
    put_key(buf, G, K1, 1, T0)
    put_key(buf, G, K2, 2, T0)
    assert unpack_index_header(buf).hash_slot_count == 2
    put_key(buf, G, K5, 3, T0)  # slot 0 already used
    put_key(buf, G, K2, 4, T0)
    assert unpack_index_header(buf).hash_slot_count == 2
    assert unpack_index_header(buf).index_count == 5


def test_true_hash_collision_returns_both_offsets() -> None:
    buf = _fresh()
    put_key(buf, G, "T#Aa", 10, T0)
    put_key(buf, G, "T#BB", 20, T0)
    put_key(buf, G, K1, 30, T0)  # different hash, maybe other slot
    # Same hash: the index cannot tell the keys apart (the caller checks the message).
    assert _select(buf, "T#Aa") == [20, 10]
    assert _select(buf, "T#BB") == [20, 10]


def test_collisions_with_a_single_slot() -> None:
    one = IndexGeometry(slot_count=1, max_entries=8)
    buf = _fresh(one)
    for number, key in enumerate([K1, K2, K5, K2, K1], start=1):
        assert put_key(buf, one, key, number * 100, T0 + number * 1_000)
    assert read_slot(buf, one, 0) == 5
    assert [_entry(buf, n, one).prev_entry_number for n in range(1, 6)] == [0, 1, 2, 3, 4]
    assert select_phy_offsets(buf, one, K1, 64, *ALL_TIME) == [500, 100]
    assert select_phy_offsets(buf, one, K2, 64, *ALL_TIME) == [400, 200]
    assert select_phy_offsets(buf, one, K5, 64, *ALL_TIME) == [300]
    assert unpack_index_header(buf).hash_slot_count == 1


def test_time_diff_is_seconds_truncated_and_clamped() -> None:
    assert time_diff_seconds(T0 + 2_999, T0) == 2  # Java long division
    assert time_diff_seconds(T0 + 999, T0) == 0
    assert time_diff_seconds(T0 - 500, T0) == 0  # Java: -500 / 1000 == 0
    assert time_diff_seconds(T0 - 5_000, T0) == 0  # negative clamps to 0
    assert time_diff_seconds(T0 + (INT_MAX + 5) * 1000, T0) == INT_MAX
    assert time_diff_seconds(T0, 0) == 0  # no begin time yet
    assert time_diff_seconds(T0, -1) == 0

    buf = _fresh()
    put_key(buf, G, K1, 1, T0)
    put_key(buf, G, K1, 2, T0 + 2_999)
    put_key(buf, G, K1, 3, T0 - 10_000)  # clock went back
    put_key(buf, G, K1, 4, T0 + (INT_MAX + 5) * 1000)
    assert [_entry(buf, n).time_diff_s for n in (1, 2, 3, 4)] == [0, 2, 0, INT_MAX]
    # Begin values come from the first entry only; end values from the last.
    header = unpack_index_header(buf)
    assert (header.begin_timestamp_ms, header.begin_phy_offset) == (T0, 1)
    assert (header.end_timestamp_ms, header.end_phy_offset) == (T0 + (INT_MAX + 5) * 1000, 4)


def test_new_file_continues_from_the_previous_one() -> None:
    buf = _fresh()
    init_index_header(buf, 7_000, T0)
    assert unpack_index_header(buf) == IndexHeader(T0, T0, 7_000, 7_000, 0, 0)
    assert put_key(buf, G, K1, 7_100, T0 + 5_500)
    # RocketMQ computes the first time diff against the inherited begin time, then moves
    # the begin time to this entry's.
    assert _entry(buf, 1).time_diff_s == 5
    assert unpack_index_header(buf) == IndexHeader(T0 + 5_500, T0 + 5_500, 7_100, 7_100, 1, 2)

    untouched = _fresh()
    init_index_header(untouched, 0, 0)  # nothing positive to carry over
    assert untouched == _fresh()


def test_time_range_filtering() -> None:
    buf = _fresh()
    for i in range(3):
        put_key(buf, G, K1, 100 + i, T0 + i * 10_000)
    assert _select(buf, K1) == [102, 101, 100]
    assert _select(buf, K1, span=(T0 + 5_000, T0 + 15_000)) == [101]
    assert _select(buf, K1, span=(T0 + 10_000, T0 + 10_000)) == [101]  # both ends inclusive
    assert _select(buf, K1, span=(T0 + 10_000, T0 + 20_000)) == [102, 101]
    assert _select(buf, K1, span=(T0 + 20_001, 2**62)) == []
    assert _select(buf, K1, span=(0, T0 - 1)) == []


def test_walk_stops_at_the_first_entry_older_than_begin() -> None:
    buf = _fresh()
    put_key(buf, G, K1, 1, T0)
    put_key(buf, G, K1, 2, T0 + 10_000)
    put_key(buf, G, K1, 3, T0 - 5_000)  # clock went back: stored as T0 (diff clamped to 0)
    assert _select(buf, K1) == [3, 2, 1]
    # RocketMQ stops at entry 3 (older than begin) and never reaches entry 2.
    assert _select(buf, K1, span=(T0 + 5_000, 2**62)) == []


def test_max_count_bounds_the_result_newest_first() -> None:
    buf = _fresh()
    for i in range(5):
        put_key(buf, G, K1, 100 + i, T0 + i * 1_000)
    assert _select(buf, K1, max_count=2) == [104, 103]
    assert _select(buf, K1, max_count=1) == [104]
    assert _select(buf, K1, max_count=0) == []


def test_full_file_returns_false_and_changes_nothing() -> None:
    tiny = IndexGeometry(slot_count=2, max_entries=3)  # entry numbers 1 and 2
    buf = _fresh(tiny)
    assert put_key(buf, tiny, K1, 1, T0)
    assert not is_index_full(read_index_header(buf), tiny)
    assert put_key(buf, tiny, K2, 2, T0)
    assert is_index_full(read_index_header(buf), tiny)
    before = bytes(buf)
    assert not put_key(buf, tiny, K5, 3, T0)
    assert bytes(buf) == before
    assert unpack_index_header(buf).index_count == 3


def test_min_value_hash_goes_to_slot_zero() -> None:
    key = "polygenelubricants"  # hashCode() == Integer.MIN_VALUE
    buf = _fresh()
    assert put_key(buf, G, key, 42, T0)
    assert read_slot(buf, G, 0) == 1
    assert _entry(buf, 1).key_hash == 0
    assert _select(buf, key) == [42]


def test_invalid_old_slot_value_is_treated_as_empty() -> None:
    buf = _fresh()
    put_key(buf, G, K2, 1, T0)
    struct.pack_into(">i", buf, G.slot_position(0), 99)  # beyond index_count: garbage
    put_key(buf, G, K1, 2, T0)
    assert _entry(buf, 2).prev_entry_number == 0
    assert unpack_index_header(buf).hash_slot_count == 2
    struct.pack_into(">i", buf, G.slot_position(3), -5)
    assert _select(buf, "T#Aa") == []  # slot 3 holds a negative number: nothing


def test_chain_walk_stops_on_corrupt_links() -> None:
    buf = _fresh()
    put_key(buf, G, K1, 1, T0)
    put_key(buf, G, K5, 2, T0)
    # A cycle 2 -> 1 -> 2, which RocketMQ's self-link check does not catch (it would return
    # [2, 2, ...] up to max_count): a link that does not go back ends the walk.
    struct.pack_into(">i", buf, G.entry_position(1) + 16, 2)
    assert _select(buf, "TopicTest#k9") == []  # same slot (0), no hash matches
    assert _select(buf, K5) == [2]
    # A self link ends the walk after that entry.
    struct.pack_into(">i", buf, G.entry_position(2) + 16, 2)
    assert _select(buf, K1) == []
    # A negative time diff ends it before.
    struct.pack_into(">ii", buf, G.entry_position(2) + 12, -1, 1)
    assert _select(buf, K1) == []


def test_index_time_matched() -> None:
    header = IndexHeader(begin_timestamp_ms=100, end_timestamp_ms=200)
    assert index_time_matched(header, 50, 250)  # covers the file
    assert index_time_matched(header, 150, 300)  # begins inside
    assert index_time_matched(header, 0, 100)  # ends on the begin
    assert not index_time_matched(header, 0, 99)
    assert not index_time_matched(header, 201, 300)


def test_buffer_too_small_is_refused() -> None:
    with pytest.raises(ValueError, match="needs 216"):
        put_key(bytearray(215), G, K1, 1, T0)
    with pytest.raises(ValueError, match="needs 216"):
        select_phy_offsets(bytes(100), G, K1, 1, *ALL_TIME)


def test_worked_example_index_file_is_byte_exact() -> None:
    """The worked example of docs/formats.md, "Index file"."""
    g = IndexGeometry(slot_count=4, max_entries=4)
    buf = bytearray(g.file_bytes)
    assert put_key(buf, g, K1, 5_000, T0)
    assert put_key(buf, g, K2, 5_115, T0 + 1_500)
    assert put_key(buf, g, K5, 5_230, T0 + 3_000)
    assert not put_key(buf, g, "TopicTest#k3", 5_345, T0 + 4_000)
    expected = bytes.fromhex(
        "0000018BCFE56800" "0000018BCFE573B8" "0000000000001388" "000000000000146E"
        "00000002" "00000004"
        "00000003" "00000002" "00000000" "00000000"
        "00000000" "0000000000000000" "00000000" "00000000"
        "0029E6A8" "0000000000001388" "00000000" "00000000"
        "0029E6A9" "00000000000013FB" "00000001" "00000000"
        "0029E6AC" "000000000000146E" "00000003" "00000001"
    )  # fmt: skip
    assert len(buf) == 136
    assert bytes(buf) == expected
    assert select_phy_offsets(buf, g, K5, 32, *ALL_TIME) == [5_230]
    assert select_phy_offsets(buf, g, K1, 32, *ALL_TIME) == [5_000]


@pytest.fixture
def local_tz(request: pytest.FixtureRequest) -> Iterator[None]:
    """Run under the POSIX time zone given as the test's parameter, then restore."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = request.param
    time.tzset()
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = saved
        time.tzset()


@pytest.mark.parametrize(
    ("local_tz", "millis", "name"),
    [
        ("UTC0", 0, "19700101000000000"),
        ("UTC0", -1, "19691231235959999"),  # Calendar floors negative times
        ("UTC0", T0 + 123, "20231114221320123"),
        ("CST-8", 0, "19700101080000000"),  # local time, as java.util.Calendar
        ("CST-8", T0 + 7, "20231115061320007"),
    ],
    indirect=["local_tz"],
)
def test_index_file_name_is_local_time(local_tz: None, millis: int, name: str) -> None:
    assert index_file_name(millis) == name
    assert parse_index_file_name(name) == millis


def test_index_file_names_sort_by_time_and_bad_names_parse_to_none() -> None:
    stamps = [T0, T0 + 1, T0 + 999, T0 + 1_000, T0 + 86_400_000]
    names = [index_file_name(t) for t in stamps]
    assert sorted(names) == names
    assert all(len(n) == 17 for n in names)
    for bad in [
        "",
        "2023111422132012",
        "202311142213201234",
        "20231314221320123",
        "2023111x221320123",
        "".join(chr(0x0660 + int(d)) for d in "20231114221320123"),  # Arabic-Indic digits
    ]:
        assert parse_index_file_name(bad) is None, bad


def test_a_put_torn_between_slot_and_header_keeps_the_older_chain() -> None:
    """A crash after the slot was written but before the header counted the entry: the
    re-put of that key must still link the older entries (Java would link the entry to
    itself)."""
    geometry = IndexGeometry(slot_count=4, max_entries=16)
    buf = bytearray(geometry.file_bytes)
    init_index_header(buf, 0, 0)
    for offset in (100, 200, 300):
        assert put_key(buf, geometry, "T#k", offset, 1_000)
    header_before = bytes(buf[:40])
    assert put_key(buf, geometry, "T#k", 400, 1_000)
    buf[:40] = header_before  # torn: slot and entry written, header not
    assert put_key(buf, geometry, "T#k", 400, 1_000)
    assert select_phy_offsets(buf, geometry, "T#k", 10, 0, 10**13) == [400, 300, 200, 100]


# -- batches: index_key_hashes, put_keys -------------------------------------------------


def test_index_key_hashes_match_one_by_one() -> None:
    rnd = random.Random(21)
    cases: list[list[bytes]] = [
        [b"TopicTest#k1"],
        [b"polygenelubricants"],  # hashCode is Integer.MIN_VALUE: RocketMQ's hash is 0
        [b"BenchTopic#key-%d" % i for i in range(100_000, 101_030)],
        [b"A#" + b"x" * n for n in range(40)],  # different lengths, one common prefix
        [b"", b"#", b"T#"],
        ["Tópico#ключ".encode(), b"T#ascii", "T#\U0001f600".encode()],  # non-ASCII, surrogates
        [b"T#\xff\xfe", b"T#ok"],  # invalid UTF-8 reads as U+FFFD
        [b"same"] * 5,
    ]
    for _ in range(50):
        prefix = rnd.choice([b"", b"T#", b"BenchTopic#key-1"])
        cases.append(
            [
                prefix + bytes(rnd.randrange(32, 127) for _ in range(rnd.randrange(0, 30)))
                for _ in range(rnd.randrange(1, 60))
            ]
        )
    for keys in cases:
        want = [index_key_hash(k.decode("utf-8", "replace")) for k in keys]
        assert index_key_hashes(keys) == want, keys
    assert index_key_hash("polygenelubricants") == 0
    assert index_key_hashes([]) == []


def _sequential(
    buf: bytearray, geometry: IndexGeometry, keys: list[str], offsets: list[int], stamps: list[int]
) -> int:
    put = 0
    for key, offset, stamp in zip(keys, offsets, stamps, strict=True):
        if not put_key(buf, geometry, key, offset, stamp):
            break
        put += 1
    return put


@pytest.mark.parametrize("seed", range(6))
def test_put_keys_writes_what_put_key_writes(seed: int) -> None:
    """Byte for byte, over batches with slot collisions inside a batch and with older
    entries, a file filling up mid-batch, timestamps before the begin time."""
    rnd = random.Random(seed)
    geometry = IndexGeometry(slot_count=rnd.choice([1, 3, 16, 1000]), max_entries=60)
    one, many = _fresh(geometry), _fresh(geometry)
    offset = rnd.choice([0, 500])
    while True:
        count = rnd.randrange(1, 12)
        keys = [f"T#{rnd.randrange(40)}" for _ in range(count)]
        offsets = [offset + 10 * i for i in range(count)]
        stamps = [T0 + rnd.randrange(-5_000, 50_000) for _ in range(count)]
        offset += 10 * count
        expected = _sequential(one, geometry, keys, offsets, stamps)
        hashes = index_key_hashes([k.encode() for k in keys])
        assert put_keys(many, geometry, hashes, offsets, stamps) == expected
        assert many == one
        if expected < count:
            break
    assert is_index_full(read_index_header(many), geometry)
    assert put_keys(many, geometry, [1], [offset], [T0]) == 0


def test_put_keys_after_a_torn_put_links_as_put_key_does() -> None:
    """A crash between a put's slot and its header: the slot names the uncounted entry."""
    one = _fresh()
    assert put_key(one, G, K1, 100, T0)
    assert put_key(one, G, K5, 200, T0)  # same slot as K1: its entry links entry 1
    # the torn put: entry 3 and the slot written, the header not
    torn = bytearray(one)
    number = read_index_header(torn).index_count
    slot_pos = G.slot_position(_slot_of(K1))
    torn[G.entry_position(number) : G.entry_position(number) + INDEX_ENTRY_BYTES] = (
        pack_index_entry(index_key_hash(K1), 300, 0, 2)
    )
    struct.pack_into(">i", torn, slot_pos, number)
    many = bytearray(torn)
    assert put_key(torn, G, K1, 300, T0)
    assert put_keys(many, G, index_key_hashes([K1.encode()]), [300], [T0]) == 1
    assert many == torn


def test_index_key_hashes_with_a_prefix_hash_prefix_plus_key() -> None:
    rnd = random.Random(5)
    for prefix in (b"", b"T#", b"BenchTopic#", "Tópico#".encode()):
        for keys in (
            [b"key-%d" % i for i in range(99_990, 100_010)],  # two lengths
            [b"k"],
            [b"", b"x"],
            [bytes(rnd.randrange(32, 127) for _ in range(rnd.randrange(9))) for _ in range(30)],
            [b"\xff", "ключ".encode()],
        ):
            assert index_key_hashes(keys, prefix) == index_key_hashes([prefix + k for k in keys])


@pytest.mark.parametrize("stamps", ["same", "few", "many", "first differs"])
def test_put_keys_time_diffs_as_put_key(stamps: str) -> None:
    """Timestamps all the same, a few distinct ones, all different, or only the first
    (which sets the begin time of a fresh file) different."""
    geometry = IndexGeometry(slot_count=1000, max_entries=400)
    keys = [f"T#k{i}" for i in range(300)]
    offsets = [100 * i for i in range(300)]
    times = {
        "same": [T0] * 300,
        "few": [T0 + 1500 * (i // 100) for i in range(300)],
        "many": [T0 + 7 * i for i in range(300)],
        "first differs": [T0 - 3000] + [T0 + 2500] * 299,
    }[stamps]
    for split in (300, 7):  # the first batch sets the begin time, the others use it
        one, many = _fresh(geometry), _fresh(geometry)
        assert _sequential(one, geometry, keys, offsets, times) == 300
        hashes = index_key_hashes([k.encode() for k in keys])
        for start in range(0, 300, split):
            end = start + split
            assert put_keys(many, geometry, hashes[start:end], offsets[start:end], times[start:end])
        assert many == one


def test_put_keys_writes_entries_with_pwrite_given_the_file(tmp_path: Path) -> None:
    """With ``fd`` (the file the buffer maps), the same bytes end up in the file."""
    geometry = IndexGeometry(slot_count=16, max_entries=64)
    keys = [f"T#{i % 20}" for i in range(50)]
    hashes = index_key_hashes([k.encode() for k in keys])
    offsets = [10 * i for i in range(50)]
    stamps = [T0 + i for i in range(50)]
    want = _fresh(geometry)
    assert put_keys(want, geometry, hashes, offsets, stamps) == 50
    path = tmp_path / "index"
    path.write_bytes(bytes(geometry.file_bytes))
    fd = os.open(path, os.O_RDWR)
    try:
        with mmap.mmap(fd, geometry.file_bytes) as mm:
            assert put_keys(mm, geometry, hashes[:30], offsets[:30], stamps[:30], fd=fd) == 30
            assert put_keys(mm, geometry, hashes[30:], offsets[30:], stamps[30:], fd=fd) == 20
            assert mm[:] == bytes(want)
    finally:
        os.close(fd)
