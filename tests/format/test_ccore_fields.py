"""The client's record reader in the compiled core (``_ccore.v4_record_fields``) against
its Python reference (``v4_record_fields_python``): the same columns on random records,
the same None on damaged, cut, padded, miscounted and uncommon (IPv6, two-byte topic
length) ones. The reference is checked against what the records were built from on both
paths (Makefile PURE_PYTHON_TESTS)."""

from __future__ import annotations

import random

import pytest

from tide.format import (
    HostAddress,
    RunWriter,
    _core,
    decode_properties,
    encode_properties,
    pack_host,
)
from tide.format._record import PHYSICAL_OFFSET_POS
from tide.format._record_spans import v4_record_fields, v4_record_fields_python

V4 = pack_host(HostAddress("10.0.0.7", 10911))
V6 = pack_host(HostAddress("2001:db8::1", 10911))
TOPICS = [b"T", b"TopicTest", "Ü".encode() * 3, b"\xff\xfe"]
LONG_TOPIC = b"L" * 200  # a two-byte topic length: V2 magic
compiled = pytest.mark.skipif(_core.ccore is None, reason="the compiled core is not built or off")


def random_records(
    rnd: random.Random, host: bytes, long_topic: bool = False
) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """Stored records (physical offsets patched in) and each one's (topic, body)."""
    writer = RunWriter(host)
    built: list[tuple[bytes, bytes]] = []
    for _ in range(rnd.randint(1, 12)):
        topic = rnd.choice([*TOPICS, LONG_TOPIC] if long_topic else TOPICS)
        body = rnd.randbytes(rnd.choice([0, 1, 128]))
        props = encode_properties(
            rnd.choice([{}, {"TAGS": "a", "KEYS": "k1 k2"}, {"X": "é"}, {"A": "", "": "b"}])
        )
        writer.add("t", topic, rnd.randrange(4), body, props, 0, 0, rnd.randrange(1 << 40))
        built.append((topic, body))
    data = bytearray(writer.getvalue())
    pos = 0
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        data[pos + PHYSICAL_OFFSET_POS : pos + PHYSICAL_OFFSET_POS + 8] = pos.to_bytes(8)
        pos += size
    return bytes(data), built


def damage(rnd: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    kind = rnd.randrange(3)
    if kind == 0:
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(len(out))
            out[at] = rnd.choice([0, 0xFF, 0x80, 0x01, 0x02, out[at] ^ 1])
    elif kind == 1:
        del out[rnd.randrange(len(out)) :]
    else:
        out += out[: rnd.randrange(len(out))]
    return bytes(out)


@pytest.mark.parametrize("seed", range(30))
def test_intact_records_read_as_built(seed: int) -> None:
    rnd = random.Random(seed)
    data, built = random_records(rnd, V4)
    for read in (v4_record_fields, v4_record_fields_python):
        fields = read(data, len(built))
        assert fields is not None
        assert list(zip(fields[10], fields[9], strict=True)) == built
        assert fields[3][0] == 0 and sum(fields[0]) == len(data)
        assert all(isinstance(props, dict) for props in fields[11])
    assert v4_record_fields_python(random_records(rnd, V6)[0], 1) is None


@compiled
@pytest.mark.parametrize("seed", range(80))
def test_compiled_agrees_with_reference(seed: int) -> None:
    assert _core.ccore is not None
    rnd = random.Random(seed)
    data, built = random_records(rnd, rnd.choice([V4, V4, V6]), rnd.random() < 0.3)
    for piece in (data, damage(rnd, data), damage(rnd, data), damage(rnd, data)):
        for count in (len(built), len(built) - 1, len(built) + 1):
            assert _core.ccore.v4_record_fields(
                piece, count, decode_properties
            ) == v4_record_fields_python(piece, count)


@compiled
def test_edge_cases() -> None:
    assert _core.ccore is not None
    empty: tuple[list[object], ...] = tuple([] for _ in range(12))
    assert (
        _core.ccore.v4_record_fields(b"", 0, decode_properties)
        == empty
        == v4_record_fields_python(b"", 0)
    )
    assert _core.ccore.v4_record_fields(b"\x00" * 95, 1, decode_properties) is None
    assert _core.ccore.v4_record_fields(b"x", 0, decode_properties) is None
    with pytest.raises(ValueError, match="negative"):
        _core.ccore.v4_record_fields(b"", -1, decode_properties)
