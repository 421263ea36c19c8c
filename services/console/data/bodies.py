"""A message body shown three ways: text (UTF-8, bad bytes replaced), JSON (pretty, only
when the body parses) and hex (the first bytes, 16 a line), each bounded."""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass

from services.console.data.limits import PREVIEW_HEX_MAX_BYTES, PREVIEW_TEXT_MAX_BYTES

HEX_LINE_BYTES = 16


@dataclass(frozen=True)
class BodyPreview:
    size_bytes: int
    text: str
    # True when the text (and JSON) views show only the first PREVIEW_TEXT_MAX_BYTES.
    text_truncated: bool
    # The body parsed as JSON, indented; None when it is not JSON (or was truncated).
    json: str | None
    hex: str
    hex_truncated: bool
    # True when the bytes are not valid UTF-8 (the text view shows U+FFFD for them).
    replaced: bool


def preview(body: bytes) -> BodyPreview:
    shown = body[:PREVIEW_TEXT_MAX_BYTES]
    text_truncated = len(body) > len(shown)
    # Not final when truncated: a multi-byte character cut by the bound is left out,
    # not shown as a bad byte.
    final = not text_truncated
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(shown, final=final)
        replaced = False
    except UnicodeDecodeError:
        text = codecs.getincrementaldecoder("utf-8")("replace").decode(shown, final=final)
        replaced = True
    return BodyPreview(
        size_bytes=len(body),
        text=text,
        text_truncated=text_truncated,
        json=None if text_truncated else pretty_json(text),
        hex=hex_dump(body[:PREVIEW_HEX_MAX_BYTES]),
        hex_truncated=len(body) > PREVIEW_HEX_MAX_BYTES,
        replaced=replaced,
    )


def pretty_json(text: str) -> str | None:
    """``text`` indented when it is a JSON object or array; None otherwise (a bare number
    or string is shown as text: nothing to pretty-print)."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return None
    try:
        value = json.loads(stripped)
    except ValueError:
        return None
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False)


def hex_dump(data: bytes) -> str:
    """Lines of ``offset  hex bytes  ascii`` (``xxd``'s layout), 16 bytes a line."""
    lines = []
    for start in range(0, len(data), HEX_LINE_BYTES):
        chunk = data[start : start + HEX_LINE_BYTES]
        hexes = " ".join(f"{byte:02x}" for byte in chunk)
        ascii_ = "".join(chr(byte) if 32 <= byte < 127 else "." for byte in chunk)
        lines.append(f"{start:08x}  {hexes:<{HEX_LINE_BYTES * 3 - 1}}  {ascii_}")
    return "\n".join(lines)
