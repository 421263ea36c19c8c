"""One place knows each layout: tide/format (issue 21). Outside it, no module spells a
record header field's position as a number, nor a struct format of the record's header,
of an index file's header or entry, of a consume-queue entry, of a timer wheel slot or
timer log unit, nor unpacks a packed host by hand; they import tide.format's names
(MAGIC_POS, ..., RECORD_HEADER_V4) and readers (scan_record, properties_position,
record_total_size, write_index_header, iter_timer_slots, iter_unit_times, unpack_host).
No module outside tide/format packs or unpacks the record's header: a record is encoded
by tide.format's encoder (encode_record; RunWriter, compiled encode_run_v4) and read
whole by its reader (v4_record_fields, compiled when built; decode_record for the rest),
issue 21's "one encoder and one reader per language"."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("tide", "services", "bench")
EXEMPT = ("tide/format/", "tide/v1/")
# A record field's position or the header's size, assigned a number.
POSITION = re.compile(
    r"^\s*_?[A-Z0-9_]*(MAGIC|BODY_CRC|QUEUE_ID|QUEUE_OFFSET|PHYSICAL_OFFSET|SYS_?FLAG|"
    r"BORN_HOST|STORE_TS|STORE_TIMESTAMP|BODY_LEN(GTH)?|HEADE?R?_V4)[A-Z0-9_]*_(POS|BYTES)(_V4)?"
    r"\s*(:\s*\w+\s*)?=\s*\d",
    re.MULTILINE,
)
# Struct formats of the header: total_size, magic, body_crc, queue_id (">iiIi..."), or
# from the magic on (">iIiiqq..."), or total_size and the 88 header bytes.
HEADER_FORMAT = re.compile(r"""["'][<>!=@]?[^"']*(iiIi|iIiiqq|i88s)""")
# The other layouts' struct formats, whole: index header, index entry, consume-queue
# entry, timer wheel slot, timer log unit (and its times alone).
OTHER_FORMAT = re.compile(r"""["'][<>!=]?(qqqqii|iqii|qiq|qqqii|iqiqiqiiq|i8x4xqi24x)["']""")
# A packed host's ``ip:port`` spelled out by hand (tide.format.unpack_host says it).
HOST_BY_HAND = re.compile(r"packed\[0\]\}\.\{packed\[1\]")
# The record header struct itself: an encoder or a reader of the record outside
# tide/format (docs/performance.md, "One place knows each layout"). There is none left;
# a new one fails the test.
HEADER_STRUCT = re.compile(r"RECORD_HEADER_V4\.(pack|unpack)")
HEADER_USERS: set[str] = set()


def sources() -> list[tuple[str, str]]:
    found = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if not name.startswith(EXEMPT):
                found.append((name, path.read_text()))
    return found


def offending_lines() -> list[str]:
    found = []
    for name, text in sources():
        for pattern in (POSITION, HEADER_FORMAT, OTHER_FORMAT, HOST_BY_HAND):
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{name}:{line}: {match.group(0).strip()}")
    return found


def test_record_header_positions_live_in_tide_format_only() -> None:
    assert offending_lines() == []


def test_no_module_outside_tide_format_packs_or_unpacks_the_record_header() -> None:
    users = {name for name, text in sources() if HEADER_STRUCT.search(text)}
    assert users == HEADER_USERS


def test_the_check_finds_a_copy() -> None:
    assert POSITION.search("BODY_CRC_POS = 8  # a copy")
    assert POSITION.search("_STORE_TS_POS_V4 = 56")
    assert HEADER_FORMAT.search('struct.Struct(">iiIiiqqiq")')
    assert not POSITION.search("BODY_CRC_POS = tide.format.BODY_CRC_POS")
    assert OTHER_FORMAT.search('_HEADER = struct.Struct(">qqqqii")')
    assert OTHER_FORMAT.search("struct.Struct('>qiq')")
    assert not OTHER_FORMAT.search('struct.Struct(">q")')
    assert HOST_BY_HAND.search('f"{packed[0]}.{packed[1]}.{packed[2]}"')
    assert HEADER_STRUCT.search("RECORD_HEADER_V4.unpack_from(data)")
