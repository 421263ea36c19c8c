"""A message a pop reads from the dispatch's tail cache is the one the storage's Read
answers for the same record: both convert with tide.stored, and the storage's fast path
(services/storage/convert.stored_message_fields) gives the same fields."""

from __future__ import annotations

from services.storage.convert import stored_message_fields
from tide.format import (
    decode_record,
    encode_properties,
    encode_record,
    pack_host,
    parse_host,
    patch_record,
)
from tide.stored import stored_message
from tide.v1 import storage_pb2 as storage_pb


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
    fields = stored_message_fields(bytes(data), physical_offset, {})
    assert fields is not None
    assert stored_message(record) == storage_pb.StoredMessage(**fields)
    assert stored_message(record).keys == ["k1", "k2"]
