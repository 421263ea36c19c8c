"""Protobuf's varints written by hand (tide.format.varint, packed_varints): the compiled
``_ccore.packed_varints`` and its pure-Python twin ``packed_varints_python`` give the
same bytes, and both are the bytes protobuf writes for a packed repeated int64 field, at
each side of every varint length boundary, on random lists, for negatives (ten bytes
each) and empty lists; both refuse a value outside int64 (OverflowError) and a non-int
(TypeError) the same way. Run on the pure-Python path too (Makefile PURE_PYTHON_TESTS)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest

from tide.format import _core, packed_varints, varint
from tide.format._varint import packed_varints_python
from tide.v1 import storage_pb2 as pb

Packer = Callable[[Sequence[int]], bytes]
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# Each side of every varint length boundary (1 to 10 bytes) in int64, zero and negatives.
BOUNDARIES = sorted(
    {0, 1, -1, INT64_MIN, INT64_MAX}
    | {(1 << bits) + delta for bits in range(7, 63, 7) for delta in (-1, 0)}
)


def _packers() -> list[Packer]:
    packers: list[Packer] = [packed_varints_python, packed_varints]
    if _core.ccore is not None:
        packers.append(_core.ccore.packed_varints)
    return packers


def protobufs_payload(values: Sequence[int]) -> bytes:
    """The payload of AppendResponse.physical_offsets (field 5, packed int64) as
    protobuf writes it: the serialization after its key and its length's varint."""
    wire = pb.AppendResponse(physical_offsets=values).SerializeToString()
    if not values:
        assert wire == b""
        return b""
    assert wire[0] == 0x2A, wire[:1]  # field 5, length-delimited
    length, shift, at = 0, 0, 1
    while True:
        byte = wire[at]
        length |= (byte & 0x7F) << shift
        shift, at = shift + 7, at + 1
        if byte < 0x80:
            break
    assert len(wire) - at == length
    return wire[at:]


@pytest.mark.parametrize("value", BOUNDARIES)
def test_varint_is_protobufs_int64(value: int) -> None:
    expected = pb.TailChunk(offset=value).SerializeToString()
    assert (b"\x08" + varint(value) if value else b"") == expected


@pytest.mark.parametrize("pack", _packers())
def test_every_boundary_packs_as_protobuf_does(pack: Packer) -> None:
    assert pack(BOUNDARIES) == protobufs_payload(BOUNDARIES)
    assert pack([-1]) == b"\xff" * 9 + b"\x01"  # a negative takes ten bytes


@pytest.mark.parametrize("pack", _packers())
def test_random_lists_pack_as_protobuf_does(pack: Packer) -> None:
    rng = random.Random(29)
    for _ in range(300):
        bits = rng.choice((7, 14, 31, 40, 63))
        values = [rng.randrange(-(1 << bits), 1 << bits) for _ in range(rng.randrange(0, 400))]
        assert pack(values) == protobufs_payload(values), values[:5]
        assert pack(tuple(values)) == pack(values)  # any sequence


@pytest.mark.parametrize("pack", _packers())
def test_an_empty_list_packs_to_nothing(pack: Packer) -> None:
    assert pack([]) == b""


@pytest.mark.parametrize("pack", _packers())
@pytest.mark.parametrize("outside", [INT64_MAX + 1, INT64_MIN - 1, 1 << 80])
def test_a_value_outside_int64_is_refused(pack: Packer, outside: int) -> None:
    with pytest.raises(OverflowError):
        pack([1, outside])


@pytest.mark.parametrize("pack", _packers())
@pytest.mark.parametrize("wrong", [1.5, "1", None, b"\x01"])
def test_a_value_that_is_not_an_int_is_refused_with_its_index(pack: Packer, wrong: object) -> None:
    with pytest.raises(TypeError, match=r"values\[2\]"):
        pack([1, 2, wrong])  # type: ignore[list-item]
