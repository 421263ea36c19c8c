"""One place knows the message record's layout: tide/format (issue 21). Outside it, no
module spells a header field's position as a number, nor a struct format of the
record's header; they import tide.format's names (MAGIC_POS, BODY_CRC_POS, ...,
RECORD_HEADER_V4) and readers (scan_record, properties_position, record_body_crc)."""

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


def offending_lines() -> list[str]:
    found = []
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name.startswith(EXEMPT):
                continue
            text = path.read_text()
            for pattern in (POSITION, HEADER_FORMAT):
                for match in pattern.finditer(text):
                    line = text.count("\n", 0, match.start()) + 1
                    found.append(f"{name}:{line}: {match.group(0).strip()}")
    return found


def test_record_header_positions_live_in_tide_format_only() -> None:
    assert offending_lines() == []


def test_the_check_finds_a_copy() -> None:
    assert POSITION.search("BODY_CRC_POS = 8  # a copy")
    assert POSITION.search("_STORE_TS_POS_V4 = 56")
    assert HEADER_FORMAT.search('struct.Struct(">iiIiiqqiq")')
    assert not POSITION.search("BODY_CRC_POS = tide.format.BODY_CRC_POS")
