"""The load generator's consumer reads the send stamp at the start of each body straight
from a RECORDS pull's bytes (tide.bench._load.body_stamps)."""

from __future__ import annotations

import pytest

from tide.bench._load import PLACEHOLDER, body_stamps, stamp
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
