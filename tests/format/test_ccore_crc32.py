"""The compiled core's body CRC (``tide/format/_crc32.h``: carry-less multiplication
when the CPU has it, zlib's crc32_z for short bodies and the last bytes) against
``zlib.crc32``: every body length from 0 to 1,100 bytes (below, at and past the 64-byte
threshold, each remainder of 16) at several alignments, and large bodies; read back
from what the compiled encoder writes and what the compiled scans accept or refuse.
Skipped when the extension is not built."""

from __future__ import annotations

import random
import struct
import zlib

import pytest

from tide.format import HostAddress, RecordError, _core, pack_host, scan_run, topic_part

pytestmark = pytest.mark.skipif(
    _core.encode_run_v4 is None, reason="the compiled core is not built or is off"
)
V4 = pack_host(HostAddress("10.0.0.7", 10911))
BODY_CRC = struct.Struct(">I")  # (the record's body_crc, 8 bytes in)
BODY_CRC_POS = 8


def encoded(bodies: list[bytes]) -> bytes:
    assert _core.encode_run_v4 is not None
    magic, part = topic_part(b"T")
    count = len(bodies)
    return _core.encode_run_v4(magic, part, [0] * count, bodies, [b""] * count, 1, V4)


def written_crcs(run: bytes) -> list[int]:
    layout = scan_run(run, 1 << 24)
    return [BODY_CRC.unpack_from(run, at + BODY_CRC_POS)[0] for at in layout.starts]


@pytest.mark.parametrize("offset", [0, 1, 7, 15])
def test_every_length_matches_zlib(offset: int) -> None:
    source = random.Random(offset).randbytes(1_200)
    bodies = [source[offset : offset + length] for length in range(1_100)]
    assert written_crcs(encoded(bodies)) == [zlib.crc32(body) for body in bodies]


def test_large_and_uniform_bodies_match_zlib() -> None:
    rnd = random.Random(5)
    bodies = [rnd.randbytes(n) for n in (4_096, 65_536, 1_000_003)]
    bodies += [bytes(4_096), b"\xff" * 4_096]
    assert written_crcs(encoded(bodies)) == [zlib.crc32(body) for body in bodies]


@pytest.mark.parametrize("flip_at", [0, 15, 16, 63, 64, 100, 127, 128, 140])
def test_one_flipped_bit_of_a_body_is_refused(flip_at: int) -> None:
    body = random.Random(flip_at).randbytes(143)  # (8 whole blocks of 16 and 15 bytes)
    run = bytearray(encoded([body]))
    run[88 + flip_at] ^= 0x10  # the body starts 88 bytes into an IPv4 record
    with pytest.raises(RecordError, match="body CRC mismatch"):
        scan_run(run, 1 << 20)
