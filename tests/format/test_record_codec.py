"""tide.format's one encoder and one reader of whole records (issue 21), differentially:

* the Python encoder (``encode_record``, which the store's codec calls) gives the bytes of
  the compiled run encoder (``encode_run_v4``) for the records both write, and every
  field back through the general decoder (``decode_record``), for any hosts (IPv4,
  IPv6), topics of 1, 127, 128 and 32767 bytes, empty and large bodies and properties;
* the reader (``v4_record_fields``: the client's pulls and the storage's StoredMessage
  reads) gives, in both twins, every field ``decode_record`` gives, for the records it
  takes (V1 magic, IPv4 hosts), and None for the others and for damaged ones; the
  compiled twin's columns equal the reference's on every input.

Runs on both paths (Makefile PURE_PYTHON_TESTS); the comparisons with the compiled twin
are skipped when it is not built or is off."""

from __future__ import annotations

import random
import zlib

import pytest

from tide.format import (
    MAX_PROPERTIES_BYTES,
    MAX_TOPIC_BYTES_V1,
    MAX_TOPIC_BYTES_V2,
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_PRODUCER_MASK,
    SYSFLAG_STORE_HOST_V6,
    DecodedRecord,
    HostAddress,
    RunWriter,
    _core,
    decode_properties,
    decode_record,
    encode_properties,
    encode_record,
    pack_host,
    patch_record,
    store_timestamp_pos,
    topic_part,
    unpack_host,
)
from tide.format._record_spans import StoredRecordFields, v4_record_fields_python

V4_HOSTS = [HostAddress("10.0.0.7", 10911), HostAddress("255.255.255.255", 65535)]
V6_HOSTS = [HostAddress("2001:db8::1", 10911), HostAddress("::", 0)]
TOPIC_SIZES = [1, 11, MAX_TOPIC_BYTES_V1, MAX_TOPIC_BYTES_V1 + 1, 200, MAX_TOPIC_BYTES_V2]
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
compiled = pytest.mark.skipif(_core.ccore is None, reason="the compiled core is not built or off")


def random_properties(rnd: random.Random) -> bytes:
    choice = rnd.randrange(5)
    if choice == 0:
        return b""
    if choice == 1:  # the largest a record holds
        return encode_properties({"BIG": "v" * (MAX_PROPERTIES_BYTES - 6)})
    if choice == 2:
        return encode_properties({"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "ABC"})
    if choice == 3:
        return encode_properties({"X": "é", "": "empty name"})
    return b"no separators at all"  # decodes to {} on every path


def random_record(
    rnd: random.Random, v6: bool, long_topic: bool = True
) -> tuple[bytes, dict[str, object]]:
    """A record and what it was built from: IPv6 hosts when ``v6``, topics longer than
    127 bytes when ``long_topic``."""
    born = rnd.choice(V4_HOSTS + V6_HOSTS if v6 else V4_HOSTS)
    store = rnd.choice(V4_HOSTS + V6_HOSTS if v6 else V4_HOSTS)
    sizes = TOPIC_SIZES if long_topic else [n for n in TOPIC_SIZES if n <= MAX_TOPIC_BYTES_V1]
    topic = bytes(rnd.choice(b"abcXYZ-_%") for _ in range(rnd.choice(sizes)))
    sys_flag = rnd.randrange(1 << 11) & SYSFLAG_PRODUCER_MASK
    sys_flag |= SYSFLAG_BORN_HOST_V6 if born.is_v6 else 0
    sys_flag |= SYSFLAG_STORE_HOST_V6 if store.is_v6 else 0
    built: dict[str, object] = {
        "topic": topic.decode(),
        "queue_id": rnd.choice([0, 1, 7, *INT32]),
        "body": rnd.randbytes(rnd.choice([0, 1, 128, 70_000])),
        "properties": decode_properties(props := random_properties(rnd)),
        "flag": rnd.choice([0, 5, *INT32]),
        "sys_flag": sys_flag,
        "born_timestamp_ms": rnd.choice([0, 1_800_000_000_000, *INT64]),
        "born_host": born,
        "store_host": store,
        "reconsume_times": rnd.choice([0, 3, *INT32]),
        "prepared_transaction_offset": rnd.choice([0, 9, *INT64]),
        "queue_offset": rnd.choice([0, 1 << 40, INT64[1]]),
        "physical_offset": 0,  # set where the record is placed
        "store_timestamp_ms": rnd.choice([0, 1_800_000_000_001, *INT64]),
    }
    record = encode_record(
        str(built["topic"]),
        topic,
        int(built["queue_id"]),  # type: ignore[call-overload]
        bytes(built["body"]),  # type: ignore[call-overload]
        props,
        int(built["flag"]),  # type: ignore[call-overload]
        sys_flag,
        int(built["born_timestamp_ms"]),  # type: ignore[call-overload]
        pack_host(born),
        pack_host(store),
        int(built["reconsume_times"]),  # type: ignore[call-overload]
        int(built["prepared_transaction_offset"]),  # type: ignore[call-overload]
    )
    assert record.sys_flag == sys_flag and record.queue_id == built["queue_id"]
    return record.data, built


def place(records: list[tuple[bytes, dict[str, object]]], base: int) -> bytes:
    """The records back to back from commitlog offset ``base``, store fields patched in."""
    out = bytearray()
    for data, built in records:
        at = len(out)
        out += data
        built["physical_offset"] = base + at
        patch_record(
            out,
            at,
            store_timestamp_pos(int(built["sys_flag"])),  # type: ignore[call-overload]
            int(built["queue_offset"]),  # type: ignore[call-overload]
            base + at,
            int(built["store_timestamp_ms"]),  # type: ignore[call-overload]
        )
    return bytes(out)


def decoded_fields(decoded: DecodedRecord) -> dict[str, object]:
    return {name: getattr(decoded, name) for name in FIELD_NAMES}


FIELD_NAMES = (
    "topic",
    "queue_id",
    "body",
    "properties",
    "flag",
    "sys_flag",
    "born_timestamp_ms",
    "born_host",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
    "queue_offset",
    "physical_offset",
    "store_timestamp_ms",
)


def fields_of_columns(columns: StoredRecordFields, index: int) -> dict[str, object]:
    """Record ``index``'s fields from the reader's columns, named as decode_record's."""
    (_, queue_id, queue_offset, physical, born_ms, store_ms, born, store, reconsume) = (
        column[index] for column in columns[:9]
    )
    body, topic, props, flag, sys_flag, prepared, crc = (column[index] for column in columns[9:])
    assert isinstance(topic, bytes) and isinstance(born, bytes) and isinstance(store, bytes)
    assert isinstance(body, bytes) and crc == zlib.crc32(body)
    return {
        "topic": topic.decode(),
        "queue_id": queue_id,
        "body": body,
        "properties": props,
        "flag": flag,
        "sys_flag": sys_flag,
        "born_timestamp_ms": born_ms,
        "born_host": unpack_host(born),
        "store_host": unpack_host(store),
        "reconsume_times": reconsume,
        "prepared_transaction_offset": prepared,
        "queue_offset": queue_offset,
        "physical_offset": physical,
        "store_timestamp_ms": store_ms,
    }


def readers() -> list[object]:
    found: list[object] = [lambda data, count: v4_record_fields_python(data, count, True)]
    if _core.ccore is not None:
        ccore = _core.ccore
        found.append(
            lambda data, count: ccore.v4_record_fields(data, count, decode_properties, True)
        )
    return found


def takes(built: dict[str, object]) -> bool:
    """Whether the reader takes the record: V1 magic (a topic of <= 127 bytes), IPv4."""
    topic = built["topic"]
    assert isinstance(topic, str)
    return len(topic) <= MAX_TOPIC_BYTES_V1 and not int(built["sys_flag"]) & 0b110000  # type: ignore[call-overload]


@pytest.mark.parametrize("seed", range(40))
def test_encoder_then_general_decoder_give_every_field_back(seed: int) -> None:
    rnd = random.Random(seed)
    records = [random_record(rnd, v6=True) for _ in range(rnd.randint(1, 6))]
    data = place(records, base=rnd.choice([0, 1 << 33]))
    pos = 0
    for record, built in records:
        decoded = decode_record(data, pos, len(data), expected_offset=built["physical_offset"])  # type: ignore[arg-type]
        assert decoded_fields(decoded) == built
        assert decoded.total_size == len(record)
        pos += len(record)


@pytest.mark.parametrize("seed", range(40))
def test_reader_gives_the_general_decoders_fields(seed: int) -> None:
    rnd = random.Random(seed)
    records = [
        random_record(rnd, v6=False, long_topic=rnd.random() < 0.1)
        for _ in range(rnd.randint(1, 6))
    ]
    data = place(records, base=rnd.choice([0, 1 << 33]))
    for read in readers():
        columns = read(data, len(records))  # type: ignore[operator]
        if not all(takes(built) for _, built in records):
            assert columns is None  # a two-byte topic length: not this reader's
            continue
        assert columns is not None
        for index, (record, built) in enumerate(records):
            assert fields_of_columns(columns, index) == built
            assert columns[0][index] == len(record)


@pytest.mark.parametrize("seed", range(40))
def test_reader_refuses_ipv6_hosts_on_both_paths(seed: int) -> None:
    rnd = random.Random(seed)
    records = [random_record(rnd, v6=True, long_topic=False) for _ in range(3)]
    data = place(records, base=0)
    expected_none = not all(takes(built) for _, built in records)
    for read in readers():
        assert (read(data, len(records)) is None) == expected_none  # type: ignore[operator]


def damaged(rnd: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    kind = rnd.randrange(4)
    if kind == 0:  # bytes flipped anywhere, the header's most often
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randrange(min(len(out), 96) if rnd.random() < 0.7 else len(out))
            out[at] = rnd.choice([0, 0xFF, 0x80, 0x7F, out[at] ^ 1])
    elif kind == 1:
        del out[rnd.randrange(len(out)) :]
    elif kind == 2:
        out += rnd.randbytes(rnd.randint(1, 100))
    else:  # a length field at its extremes
        at = rnd.choice([0, 84])
        out[at : at + 4] = rnd.choice([b"\x7f\xff\xff\xff", b"\x80\x00\x00\x00", bytes(4)])
    return bytes(out)


@compiled
@pytest.mark.parametrize("seed", range(60))
def test_compiled_reader_equals_reference_on_damaged_records(seed: int) -> None:
    assert _core.ccore is not None
    rnd = random.Random(seed)
    records = [random_record(rnd, v6=rnd.random() < 0.2) for _ in range(rnd.randint(1, 4))]
    data = place(records, base=rnd.choice([0, 4096]))
    for piece in (data, *(damaged(rnd, data) for _ in range(6))):
        for count in (len(records) - 1, len(records), len(records) + 1):
            for stored in (False, True):
                assert _core.ccore.v4_record_fields(
                    piece, count, decode_properties, stored
                ) == v4_record_fields_python(piece, count, stored)


@compiled
@pytest.mark.parametrize("seed", range(30))
def test_python_encoder_equals_the_compiled_run_encoder(seed: int) -> None:
    """encode_record with the fields a run leaves to the store zero (flag, sys_flag,
    reconsume, prepared offset 0, store host 8 zero bytes) is encode_run_v4's record."""
    rnd = random.Random(seed)
    born = pack_host(rnd.choice(V4_HOSTS))
    topic = bytes(rnd.choice(b"abc") for _ in range(rnd.choice(TOPIC_SIZES)))
    count = rnd.randint(0, 5)
    ids = [rnd.choice([0, 3, *INT32]) for _ in range(count)]
    bodies = [rnd.randbytes(rnd.choice([0, 1, 128, 70_000])) for _ in range(count)]
    props = [random_properties(rnd) for _ in range(count)]
    born_ms = rnd.choice([0, 1_800_000_000_000, *INT64])
    writer = RunWriter(born)
    writer.add_many(*topic_part(topic), ids, bodies, props, born_ms)
    python = b"".join(
        encode_record("t", topic, queue_id, body, prop, 0, 0, born_ms, born, bytes(8)).data
        for queue_id, body, prop in zip(ids, bodies, props, strict=True)
    )
    assert writer.getvalue() == python


def test_edge_sizes_read_and_refused_alike() -> None:
    """The largest V1 topic and properties and an empty body are read; one byte more
    topic is a V2 record (refused); a run cut one byte short is refused."""
    edge = []
    for topic_size, props in ((MAX_TOPIC_BYTES_V1, MAX_PROPERTIES_BYTES), (1, 0)):
        record = encode_record(
            "x" * topic_size,
            b"x" * topic_size,
            0,
            b"",
            encode_properties({"P": "v" * (props - 3)}) if props else b"",
            0,
            0,
            0,
            pack_host(V4_HOSTS[0]),
            pack_host(V4_HOSTS[0]),
        )
        assert len(record.data) == 91 + topic_size + props
        edge.append(record.data)
    long_topic = encode_record(
        "y" * 128, b"y" * 128, 0, b"", b"", 0, 0, 0, pack_host(V4_HOSTS[0]), bytes(8)
    ).data
    data = b"".join(edge)
    for read in readers():
        columns = read(data, 2)  # type: ignore[operator]
        assert columns is not None and columns[9] == [b"", b""]
        assert columns[10] == [b"x" * MAX_TOPIC_BYTES_V1, b"x"]
        assert len(columns[11][0]["P"]) == MAX_PROPERTIES_BYTES - 3
        assert read(data[:-1], 2) is None  # type: ignore[operator]
        assert read(long_topic, 1) is None  # type: ignore[operator]
        assert read(b"", 0) == tuple([] for _ in range(16))  # type: ignore[operator]
