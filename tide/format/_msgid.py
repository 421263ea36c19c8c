"""Offset message ids: ``hex_upper(store_ip + store_port + physical_offset)``."""

from __future__ import annotations

import struct
from functools import lru_cache

from tide.format._hosts import HostAddress, pack_host, unpack_host
from tide.quoting import quote

_OFFSET = struct.Struct(">q")


class MessageIdError(ValueError):
    """A string that is not an offset message id."""


# A store has one host (a cluster a few): cached, as each stored message's id needs it
# (parsing the address again cost more than the rest of a POP answer's message).
@lru_cache(maxsize=256)
def msg_id_prefix(store_host: HostAddress) -> str:
    """The constant part of every id a store issues (hex of its packed address)."""
    return pack_host(store_host).hex().upper()


def make_msg_id(prefix: str, physical_offset: int) -> str:
    """``prefix`` from :func:`msg_id_prefix`; the offset as 16 upper-case hex digits."""
    assert physical_offset >= 0, physical_offset
    return f"{prefix}{physical_offset:016X}"


def parse_msg_id(msg_id: str) -> tuple[HostAddress, int]:
    """Return (store host, physical offset); 32 hex chars for IPv4, 56 for IPv6."""
    if len(msg_id) not in (32, 56):
        raise MessageIdError(f"message id {quote(msg_id)} must be 32 (IPv4) or 56 (IPv6) hex chars")
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise MessageIdError(f"message id {quote(msg_id)} is not hexadecimal") from None
    (offset,) = _OFFSET.unpack(raw[-8:])
    return unpack_host(raw[:-8]), offset
