"""The pull's span check and tag filter in the compiled core (``_ccore.span_records``,
``_ccore.record_tags``) against their Python references (``span_records_python``,
``record_tags_python``): the same answers on random, damaged and edge-case records, and
where the compiled tag filter declines (None) the reference's answer or error. Run on
the pure-Python path too (Makefile PURE_PYTHON_TESTS), where the references are checked
against what the records were built from."""

from __future__ import annotations

import random

import pytest

from tide.format import (
    HostAddress,
    RunWriter,
    _core,
    encode_properties,
    pack_host,
    record_tags,
    span_records,
)
from tide.format._columns import TagColumns
from tide.format._record import PHYSICAL_OFFSET_POS
from tide.format._record_spans import record_tags_python, span_records_python

V4 = pack_host(HostAddress("10.0.0.7", 10911))
V6 = pack_host(HostAddress("2001:db8::1", 10911))
TOPICS = ["T", "TopicTest", "L" * 200]  # (the last: a two-byte topic length)
TAG_CHOICES = [None, "", "a", "TagA", "Ü", "x" * 300]
compiled = pytest.mark.skipif(_core.ccore is None, reason="the compiled core is not built or off")


def random_records(rnd: random.Random, offset: int) -> tuple[bytes, list[str]]:
    """Records as stored at ``offset`` (physical offsets patched in), and their TAGS."""
    writer = RunWriter(rnd.choice([V4, V4, V4, V6]))
    tags: list[str] = []
    for _ in range(rnd.randint(1, 12)):
        topic = rnd.choice(TOPICS)
        tag = rnd.choice(TAG_CHOICES)
        props: dict[str, str] = {"KEYS": "k"} if rnd.random() < 0.5 else {}
        if tag is not None:
            props["TAGS"] = tag
        tags.append(tag or "")
        body = rnd.randbytes(rnd.choice([0, 1, 128]))
        writer.add(topic, topic.encode(), rnd.randrange(4), body, encode_properties(props), 0, 0, 1)
    data = bytearray(writer.getvalue())
    pos = 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        data[pos + PHYSICAL_OFFSET_POS : pos + PHYSICAL_OFFSET_POS + 8] = (offset + pos).to_bytes(8)
        pos += size
    return bytes(data), tags


def damage(rnd: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    kind = rnd.randrange(3)
    if kind == 0:
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(out))
            out[at] = rnd.choice([0, 0xFF, 0x01, 0x02, out[at] ^ 1])
    elif kind == 1:
        del out[rnd.randrange(len(out)) :]
    else:
        out += out[: rnd.randrange(len(out))]
    return bytes(out)


def reference_tags(data: bytes, count: int) -> TagColumns | str:
    try:
        return record_tags_python(data, count)
    except Exception as exc:  # the reference's error, whatever it is, is the answer
        return type(exc).__name__


@pytest.mark.parametrize("seed", range(40))
def test_intact_records_read_as_built(seed: int) -> None:
    rnd = random.Random(seed)
    data, tags = random_records(rnd, offset=rnd.randrange(1 << 40))
    assert record_tags(data, len(tags))[1] == tags
    assert record_tags_python(data, len(tags))[1] == tags


@pytest.mark.parametrize("seed", range(40))
def test_span_counts_agree(seed: int) -> None:
    rnd = random.Random(seed)
    offset = rnd.randrange(1 << 40)
    data, tags = random_records(rnd, offset)
    assert span_records(data, offset, len(tags)) == len(tags)
    for piece in (data, damage(rnd, data), damage(rnd, data), b""):
        for at_most in (0, len(tags) - 1, len(tags), 1 << 20):
            for at in (offset, offset + 1):
                want = span_records_python(piece, at, at_most)
                assert span_records(piece, at, at_most) == want


@compiled
@pytest.mark.parametrize("seed", range(80))
def test_tags_agree_on_damaged_records(seed: int) -> None:
    assert _core.ccore is not None
    rnd = random.Random(seed)
    data, tags = random_records(rnd, offset=0)
    for piece in (data, damage(rnd, data), damage(rnd, data)):
        for count in (len(tags), len(tags) - 1, len(tags) + 1):
            want = reference_tags(piece, count)
            got = _core.ccore.record_tags(piece, count)
            if got is not None:  # it answers only what the reference answers the same
                assert got == want
            try:
                assert record_tags(piece, count) == want
            except Exception as exc:
                assert type(exc).__name__ == want


@compiled
def test_edge_cases() -> None:
    assert _core.ccore is not None
    assert _core.ccore.record_tags(b"", 0) == ([], [])
    assert _core.ccore.record_tags(b"\x00" * 3, 1) is None
    with pytest.raises(ValueError, match="negative"):
        _core.ccore.record_tags(b"", -1)
    assert _core.ccore.span_records(b"", 0, 0) == 0
    assert _core.ccore.span_records(b"\x00" * 90, 0, 5) == -1
