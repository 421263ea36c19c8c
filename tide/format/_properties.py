"""Message properties: ``name \\x01 value \\x02`` repeated, UTF-8 (RocketMQ's encoding)."""

from __future__ import annotations

from collections.abc import Mapping

from tide.quoting import quote

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Well-known property names (formats.md).
KEYS = "KEYS"
TAGS = "TAGS"
UNIQ_KEY = "UNIQ_KEY"
WAIT = "WAIT"
DELAY = "DELAY"


def property_error(name: str, value: str) -> str | None:
    """Why this property cannot be encoded, or None when it can."""
    for label, text in (("name", name), ("value", value)):
        if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
            return (
                f"the {label} of property {quote(name)} contains a reserved \\x01 or \\x02 "
                "character"
            )
    if not name:
        return "property name is empty"
    return None


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Encode in the mapping's order. Callers validate with :func:`property_error` first."""
    if not properties:
        return b""
    return "".join(
        f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
        for name, value in properties.items()
    ).encode("utf-8")


def decode_properties(data: bytes) -> dict[str, str]:
    """Decode; tolerant of a missing final separator, as RocketMQ's decoder is."""
    result: dict[str, str] = {}
    if not data:
        return result
    for item in data.decode("utf-8", errors="replace").split(PROPERTY_SEPARATOR):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            result[name] = value
    return result
