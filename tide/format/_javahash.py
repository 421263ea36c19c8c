"""Java's ``String.hashCode()`` and the two RocketMQ hashes built on it.

``hashCode`` is ``s[0]*31^(n-1) + s[1]*31^(n-2) + ... + s[n-1]`` in 32-bit two's complement
arithmetic, over the string's UTF-16 code units: a character outside the BMP counts as its
two surrogate units. Python strings are code points, so non-ASCII text is encoded to
UTF-16 first; ASCII text is its own code units.

* :func:`tags_code`: the consume queue's tags code, ``MessageExtBrokerInner.tagsString2tagsCode``
  (``if (null == tags || tags.length() == 0) return 0; return tags.hashCode();``).
* :func:`index_key_hash`: the index file's key hash, ``IndexFile.indexKeyHashMethod``
  (``Math.abs(key.hashCode())``, and 0 when that stays negative, i.e. for Integer.MIN_VALUE).
"""

from __future__ import annotations

import operator
import struct
from collections.abc import Sequence

_MASK = 0xFFFFFFFF
_SIGN = 0x80000000
# Code units are summed against a table of powers of 31 (mod 2^32), a chunk at a time: the
# multiply-and-add runs in C (map + sum) instead of one Python step per character.
_CHUNK = 256
_POW31 = tuple(pow(31, k, 1 << 32) for k in range(_CHUNK + 1))


def _utf16_units(s: str) -> Sequence[int]:
    """The UTF-16 code units Java stores for ``s`` (lone surrogates kept as they are)."""
    if s.isascii():
        return s.encode("ascii")
    data = s.encode("utf-16-be", "surrogatepass")
    return struct.unpack(f">{len(data) // 2}H", data)


def _hash_units(units: Sequence[int]) -> int:
    """``sum(u[i] * 31^(n-1-i)) mod 2^32``, unsigned."""
    h = 0
    for start in range(0, len(units), _CHUNK):  # bounded by len(units) / _CHUNK
        chunk = units[start : start + _CHUNK]
        # reversed(chunk) pairs the last unit with 31^0; zip stops at the chunk's end.
        h = (h * _POW31[len(chunk)] + sum(map(operator.mul, reversed(chunk), _POW31))) & _MASK
    return h


def java_string_hashcode(s: str) -> int:
    """Exactly Java's ``s.hashCode()``: a signed 32-bit int."""
    h = _hash_units(_utf16_units(s))
    return h - (1 << 32) if h & _SIGN else h


def sharding_key_index(key: str, count: int) -> int:
    """The queue of a sharding key among ``count`` queues sorted by (broker, queue id):
    RocketMQ's SelectMessageQueueByHash, ``Math.abs(key.hashCode() % count)`` (Java's
    remainder keeps the sign)."""
    return abs(java_string_hashcode(key)) % count  # abs(a % n) == abs(a) % n


def tags_code(tags: str) -> int:
    """The consume queue's tags code: ``hashCode(tags)`` widened to 64 bits, 0 when empty."""
    return java_string_hashcode(tags) if tags else 0


def index_key_hash(key: str) -> int:
    """``IndexFile.indexKeyHashMethod``: ``abs(hashCode(key))``, 0 for Integer.MIN_VALUE."""
    h = java_string_hashcode(key)
    # Java's Math.abs(Integer.MIN_VALUE) overflows to MIN_VALUE, which RocketMQ maps to 0.
    return 0 if h == -_SIGN else abs(h)
