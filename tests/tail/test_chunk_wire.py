"""parse_tail_chunk reads TailChunk messages as the generated class does."""

from __future__ import annotations

import random

import pytest
from google.protobuf.message import DecodeError

from tide.tail._follower import parse_tail_chunk
from tide.v1 import storage_pb2 as pb


def _same(raw: bytes) -> None:
    expected = pb.TailChunk.FromString(raw)
    got = parse_tail_chunk(raw)
    assert (got.offset, bytes(got.data), got.max_offset) == (
        expected.offset,
        expected.data,
        expected.max_offset,
    )


def test_messages_as_the_storage_sends_them() -> None:
    rng = random.Random(5)
    cases = [
        pb.TailChunk(),
        pb.TailChunk(offset=0, data=b"", max_offset=0),
        pb.TailChunk(offset=1 << 40, data=b"x" * 300_000, max_offset=(1 << 62) + 3),
        pb.TailChunk(offset=-5, data=b"\x00\x80", max_offset=-(1 << 63)),
        pb.TailChunk(offset=(1 << 63) - 1, data=b"a", max_offset=127),
    ]
    for _ in range(300):
        cases.append(
            pb.TailChunk(
                offset=rng.randrange(0, 1 << rng.randrange(1, 63)),
                data=rng.randbytes(rng.randrange(0, 3000)),
                max_offset=rng.randrange(0, 1 << rng.randrange(1, 63)),
            )
        )
    for message in cases:
        _same(message.SerializeToString())


def test_field_order_repeats_and_unknown_fields() -> None:
    first = pb.TailChunk(offset=7, data=b"old", max_offset=9).SerializeToString()
    second = pb.TailChunk(offset=8, data=b"new").SerializeToString()
    # unknown fields: 4 varint, 5 length-delimited, 6 fixed64, 7 fixed32
    unknown = b"\x20\x96\x01" + b"\x2a\x03abc" + b"\x31" + bytes(8) + b"\x3d" + bytes(4)
    for raw in (first + second, second + first, unknown + first, first + unknown):
        _same(raw)
    view = parse_tail_chunk(first + second)
    assert isinstance(view.data, memoryview)  # no copy of the commitlog bytes


def test_a_damaged_message_is_refused() -> None:
    raw = pb.TailChunk(offset=300, data=b"abcdef", max_offset=301).SerializeToString()
    refused = 0
    for cut in range(1, len(raw)):
        try:
            pb.TailChunk.FromString(raw[:cut])
        except DecodeError:
            refused += 1
            with pytest.raises(ValueError, match="TailChunk"):
                parse_tail_chunk(raw[:cut])
        else:  # cut between two fields
            _same(raw[:cut])
    assert refused == len(raw) - 1 - 2
    # known fields with another wire type: skipped, as unknown fields
    for raw in (b"\x0a\x01x", b"\x10\x01", b"\x19" + bytes(8), b"\x1d" + bytes(4)):
        _same(raw)
    with pytest.raises(ValueError, match="wire type"):
        parse_tail_chunk(b"\x43")  # field 8, a group
    with pytest.raises(ValueError, match="varint"):
        parse_tail_chunk(b"\x08" + b"\xff" * 11)
