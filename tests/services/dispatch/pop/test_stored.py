"""A message a pop reads from the dispatch's tail cache is the one the storage's Read
answers for the same record (services/dispatch/pop/stored.py against the storage's own
conversion)."""

from __future__ import annotations

from services.dispatch.pop.stored import stored_message
from services.storage.convert import stored_message as storage_stored_message
from tide.format import (
    decode_record,
    encode_properties,
    encode_record,
    pack_host,
    parse_host,
    patch_record,
)


def test_a_cached_record_reads_as_the_storage_reads_it() -> None:
    properties = encode_properties({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "U1", "n": "1"})
    encoded = encode_record(
        "T1",
        b"T1",
        3,
        b"body",
        properties,
        7,
        0,
        1_700_000_000_000,
        pack_host(parse_host("10.0.0.1:5000")),
        pack_host(parse_host("10.0.0.2:10911")),
        2,
    )
    data = bytearray(encoded.data)
    physical_offset = 4096
    patch_record(data, 0, encoded.store_timestamp_pos, 41, physical_offset, 5)
    record = decode_record(bytes(data), 0, len(data), expected_offset=physical_offset)
    assert stored_message(record) == storage_stored_message(record)
    assert stored_message(record).keys == ["k1", "k2"]
