"""KEYS, TAGS and UNIQ_KEY of a batch of records, read as decode_properties reads them."""

from __future__ import annotations

import random

import pytest

from services.dispatch.engine.batch_fields import (
    DispatchProperties,
    TagsCodes,
    _same_names,
    dispatch_properties,
    properties_between,
    properties_in,
    properties_of_records,
    split_keys,
)
from tide.format import KEYS, TAGS, UNIQ_KEY, decode_properties, encode_properties, tags_code


def expected(props: list[bytes]) -> DispatchProperties:
    """What the decoder says, in the shape dispatch_properties gives."""
    keys: list[bytes] = []
    tags: list[bytes] = []
    uniq: list[bytes | None] = []
    for data in props:
        decoded = decode_properties(data)
        keys.append(decoded.get(KEYS, "").encode())
        tags.append(decoded.get(TAGS, "").encode())
        value = decoded.get(UNIQ_KEY)
        uniq.append(None if value is None else value.encode())
    return DispatchProperties(keys, tags, uniq)


def check(props: list[bytes]) -> None:
    got = dispatch_properties(props)
    want = expected(props)
    # values are compared as the decoder's text: invalid UTF-8 reads as U+FFFD in both
    assert [k.decode("utf-8", "replace") for k in got.keys] == [k.decode() for k in want.keys]
    assert [t.decode("utf-8", "replace") for t in got.tags] == [t.decode() for t in want.tags]
    assert [None if u is None else u.decode("utf-8", "replace") for u in got.uniq_keys] == [
        None if u is None else u.decode() for u in want.uniq_keys
    ]


def enc(**props: str) -> bytes:
    return encode_properties(props)


CASES = {
    "no properties": b"",
    "no keys": enc(TAGS="TagA"),
    "one key": enc(TAGS="TagA", KEYS="k1"),
    "several keys": enc(KEYS="k1 k2  k3 "),
    "uniq key only": enc(UNIQ_KEY="7F0000010001ABCD"),
    "empty uniq key": enc(UNIQ_KEY=""),
    "empty tags": enc(TAGS=""),
    "non-ASCII tags": enc(TAGS="标签·é", KEYS="ключ"),
    "everything": enc(UNIQ_KEY="U1", WAIT="true", TAGS="T", KEYS="a b"),
    "duplicate names, last wins": (
        b"KEYS\x01first\x02TAGS\x01t1\x02KEYS\x01second\x02TAGS\x01t2\x02"
    ),
    "names as suffixes": b"XKEYS\x01no\x02MYTAGS\x01no\x02UNIQ_KEYS\x01no\x02",
    "names as prefixes": b"KEYSX\x01no\x02TAGS_\x01no\x02",
    "value with \\x01": b"KEYS\x01a\x01b\x02",
    "item without \\x01": b"KEYS\x02TAGS\x02UNIQ_KEY\x02",
    "empty items": b"\x02\x02KEYS\x01k\x02\x02\x02",
    "no final separator": b"TAGS\x01t\x02KEYS\x01last",
    "a name that looks like a value": b"A\x01KEYS\x01x\x02",
    "invalid UTF-8": b"TAGS\x01\xff\xfe\x02KEYS\x01\xc3\x02",
    "a zero byte item (the record mark)": b"\x00\x02KEYS\x01k0\x02",
    "a zero byte after a separator": b"KEYS\x01k\x02\x00TAGS\x01t\x02",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_case_alone_and_among_others(name: str) -> None:
    check([CASES[name]])
    others = [CASES[k] for k in sorted(CASES)]
    check(others)  # every case in one batch
    check([CASES[name], *others, CASES[name]])


def test_random_properties_match_the_decoder() -> None:
    rnd = random.Random(11)
    alphabet = [b"KEYS", b"TAGS", b"UNIQ_KEY", b"K", b" ", b"\x01", b"\x02", b"\x00", b"x", b"\xc3"]
    batch = [
        b"".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 12))) for _ in range(400)
    ]
    check(batch)
    for start in range(0, 400, 37):
        check(batch[start : start + 5])


def test_bounds_and_slices_of_a_buffer() -> None:
    props = [CASES[k] for k in sorted(CASES)]
    data = b"".join(props)
    bounds = [0]
    for p in props:
        bounds.append(bounds[-1] + len(p))
    assert properties_in(data, bounds) == dispatch_properties(props)
    assert properties_between(data, bounds[:-1], bounds[1:]) == dispatch_properties(props)
    assert dispatch_properties([]) == DispatchProperties([], [], [])


def test_properties_of_records_end_where_the_records_do() -> None:
    """A RecordBatch's way (positions and sizes, no list of ends): the same columns."""
    rnd = random.Random(5)
    props = [CASES[k] for k in sorted(CASES)] * 3
    rnd.shuffle(props)
    heads = [bytes(rnd.randrange(0, 40)) for _ in props]  # a record's bytes before them
    data = b"".join(head + p for head, p in zip(heads, props, strict=True))
    positions, starts, sizes, at = [], [], [], 0
    for head, p in zip(heads, props, strict=True):
        positions.append(at)
        starts.append(at + len(head))
        sizes.append(len(head) + len(p))
        at += len(head) + len(p)
    assert properties_of_records(data, starts, positions, sizes) == dispatch_properties(props)
    assert properties_of_records(b"", [], [], []) == DispatchProperties([], [], [])


def test_split_keys_is_the_decoder_split() -> None:
    assert split_keys(b" a  b c ", 64) == [b"a", b"b", b"c"]
    assert split_keys(b"", 64) == []
    assert split_keys(b" ".join(b"k%d" % i for i in range(70)), 64) == [
        b"k%d" % i for i in range(64)
    ]


def test_tags_codes_are_the_hash_of_the_text() -> None:
    codes = TagsCodes()
    for tags in ["", "TagA", "标签", "a||b"]:
        assert codes[tags.encode()] == tags_code(tags)
    assert codes[b"\xff"] == tags_code("\ufffd")


def _same_names_batch(
    rnd: random.Random, names: list[str], count: int, constant: frozenset[str] = frozenset()
) -> list[bytes]:
    """Records of these names; the ``constant`` ones of one value in every record."""
    return [
        encode_properties(
            {
                name: "one" if name in constant else f"v{rnd.randrange(10 ** rnd.randrange(1, 8))}"
                for name in names
            }
        )
        for _ in range(count)
    ]


@pytest.mark.parametrize(
    "names",
    [["KEYS"], ["TAGS", "KEYS"], ["UNIQ_KEY", "WAIT", "TAGS", "KEYS"], ["A"], ["UNIQ_KEY"]],
)
def test_records_of_the_same_names_match_the_decoder(names: list[str]) -> None:
    """The counting fast path (every record holds the same names in the same order)."""
    rnd = random.Random(5)
    batch = _same_names_batch(rnd, names, 300)
    assert _same_names(batch) is not None  # the fast path
    check(batch)
    check(batch[:1])


@pytest.mark.parametrize("constant", [{"TAGS"}, {"TAGS", "KEYS"}, {"UNIQ_KEY"}, {"WAIT"}])
def test_names_of_one_value_in_every_record_match_the_decoder(constant: set[str]) -> None:
    """A column whose items are all the same (one tag) is checked once."""
    rnd = random.Random(6)
    names = ["UNIQ_KEY", "WAIT", "TAGS", "KEYS"]
    batch = _same_names_batch(rnd, names, 100, frozenset(constant))
    assert _same_names(batch) is not None
    check(batch)
    for damaged in (b"\x00" + batch[0][1:], batch[0].replace(b"TAGS", b"TAGX")):
        check([damaged] * 3)
        check([damaged, *batch[1:]])


def test_damaged_records_of_the_same_names_match_the_decoder() -> None:
    """One record of a same-names batch changed (a byte replaced, inserted, dropped: a
    separator, a name, a zero byte, an item more or less): still the decoder's answer."""
    rnd = random.Random(9)
    specials = [b"\x00", b"\x01", b"\x02", b"K", b"KEYS\x01", b"\x02KEYS\x01x", b"\x02\x00"]
    for _ in range(400):
        names = rnd.choice([["KEYS"], ["TAGS", "KEYS", "UNIQ_KEY"]])
        batch = _same_names_batch(rnd, names, 20, frozenset(rnd.choice([(), ("TAGS",)])))
        index = rnd.randrange(len(batch))
        damaged = batch[index]
        at = rnd.randrange(len(damaged) + 1)
        cut = at + rnd.randrange(0, 3)
        damaged = damaged[:at] + rnd.choice(specials) * rnd.randrange(0, 2) + damaged[cut:]
        batch[index] = damaged
        check(batch)


def test_duplicate_names_of_the_same_layout_take_the_last() -> None:
    batch = [b"KEYS\x01a%d\x02KEYS\x01b%d\x02" % (i, i) for i in range(10)]
    assert _same_names(batch) is not None
    assert dispatch_properties(batch).keys == [b"b%d" % i for i in range(10)]
    check(batch)


def test_one_name_records_whose_separators_moved_match_the_decoder() -> None:
    """Counts that add up over the batch, not per record: a record missing its final
    \\x02 and one with a second; a mark inside a value."""
    keys = [b"KEYS\x01k%d\x02" % i for i in range(6)]
    check([b"KEYS\x01a", b"KEYS\x01b\x02c\x02", *keys])
    check([*keys, b"KEYS\x01a\x02\x02", b"KEYS\x01b"])
    check([b"KEYS\x01a\x02\x00KEYS\x01b\x02", *keys])
    check([b"KEYS\x01a\x02", b"KEYS\x02\x01b\x02"])
