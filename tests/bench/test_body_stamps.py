"""The load generator's consumer reads the send stamp at the start of each body straight
from a RECORDS pull's bytes (tide.bench._load.body_stamps)."""

from __future__ import annotations

import random

import pytest

from tide.bench._load import PLACEHOLDER, _uniform_stamps, _walked_stamps, body_stamps, stamp
from tide.format import (
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    encode_properties,
    encode_record,
    pack_host,
    parse_host,
)

V4 = pack_host(parse_host("10.0.0.1:9000"))
V6 = pack_host(parse_host("[::1]:9000"))


def record(body: bytes, born: bytes = V4, store: bytes = V4, properties: bytes = b"") -> bytes:
    sys_flag = (SYSFLAG_BORN_HOST_V6 if born == V6 else 0) | (
        SYSFLAG_STORE_HOST_V6 if store == V6 else 0
    )
    return encode_record("T", b"T", 0, body, properties, 0, sys_flag, 1, born, store).data


def test_stamps_of_records_with_either_host_size() -> None:
    stamps = [stamp(n) for n in (1, 2, 3, 4)]
    records = [
        record(stamps[0] + b"rest"),
        record(stamps[1], born=V6),
        record(stamps[2] + bytes(100), store=V6, properties=encode_properties({"a": "b"})),
        record(stamps[3], born=V6, store=V6),
    ]
    assert body_stamps(b"".join(records), 4) == stamps
    assert body_stamps(b"", 0) == []


def test_stamps_read_the_placeholder_length() -> None:
    assert body_stamps(record(PLACEHOLDER + b"x"), 1) == [PLACEHOLDER]


def test_bytes_left_over_are_an_error() -> None:
    one = record(stamp(5))
    with pytest.raises(AssertionError, match=f"1 records end at {len(one)} of {len(one) + 3}"):
        body_stamps(one + b"xyz", 1)


def test_records_of_one_size_and_layout_are_read_by_stride() -> None:
    records = b"".join(record(stamp(n) + b"body") for n in range(50))
    stamps = [stamp(n) for n in range(50)]
    assert _uniform_stamps(records, 50, len(records) // 50, 16) == stamps
    assert body_stamps(records, 50) == stamps == _walked_stamps(records, 50, 16)


def test_the_stride_read_declines_what_differs_and_the_walk_answers() -> None:
    same_size_other_layout = [
        record(stamp(1) + bytes(12)),  # IPv4 born host: 12 bytes shorter header ...
        record(stamp(2), born=V6),  # ... than an IPv6 one: the same total size
    ]
    assert len(same_size_other_layout[0]) == len(same_size_other_layout[1])
    joined = b"".join(same_size_other_layout)
    assert _uniform_stamps(joined, 2, len(joined) // 2, 16) is None
    assert body_stamps(joined, 2) == [stamp(1), stamp(2)]
    # sizes that add up to a multiple of the count without being equal
    uneven = record(stamp(3)) + record(stamp(4) + bytes(20)) + record(stamp(5) + bytes(10))
    assert len(uneven) % 3 == 0
    assert _uniform_stamps(uneven, 3, len(uneven) // 3, 16) is None
    assert body_stamps(uneven, 3) == [stamp(3), stamp(4), stamp(5)]


def test_random_runs_read_alike_by_stride_and_by_walk() -> None:
    rng = random.Random(7)
    for _ in range(300):
        count = rng.randint(1, 8)
        uniform = rng.random() < 0.5
        extra = rng.randint(0, 30)
        born = V6 if rng.random() < 0.3 else V4
        records = []
        for _ in range(count):
            tail = bytes(extra if uniform else rng.randint(0, 30))
            host = born if uniform else (V6 if rng.random() < 0.3 else V4)
            records.append(record(stamp(rng.getrandbits(60)) + tail, born=host))
        joined = b"".join(records)
        assert body_stamps(joined, count) == _walked_stamps(joined, count, 16)
