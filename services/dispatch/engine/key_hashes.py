"""Index hashes of a batch of keys: :func:`tide.format.index_key_hashes`, cheaper for the
usual batch, where every key is ASCII and of one length.

Java's hashCode is Horner's rule over the code units (``h = 31 * h + unit``, mod 2^32):
``tide.format`` runs it over the columns of the keys laid out as a byte matrix, every
key at once in 64-bit lanes of one big integer. For keys of one length, this version
also finds the columns every key shares (their common prefix: ``order-``, ``k1``) with a
strided comparison per column rather than ``min``/``max`` over the keys, and takes
``abs`` (``IndexFile.indexKeyHashMethod``; 0 for Integer.MIN_VALUE) on the lanes as well,
with a few big-integer operations, instead of a step per key. Anything else (keys of
different lengths, non-ASCII bytes) goes to ``tide.format``.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Sequence

from tide.format import IntColumn, _core, index_key_hashes

_LITTLE = sys.byteorder == "little"
_LANE_MASK_EVERY = 6  # a lane holds < 2^32 after masking and grows 5 bits + 255 a step
_LOW32_LANE = b"\0\0\0\0\xff\xff\xff\xff"
_ONE_LANE = b"\0\0\0\0\0\0\0\1"
_U32 = 0xFFFFFFFF
_compiled = _core.index_key_hashes_ascii


def key_hashes(keys: Sequence[bytes], prefix: bytes = b"") -> IntColumn:
    """:func:`tide.format.index_key_hashes` (same arguments, equal values): the compiled
    core's for ASCII keys (an array('q'), no int object a key), else
    :func:`key_hashes_python` (a list)."""
    if _compiled is not None:
        found = _compiled(keys, prefix)
        if found is not None:
            return found
    return key_hashes_python(keys, prefix)


def key_hashes_python(keys: Sequence[bytes], prefix: bytes = b"") -> list[int]:
    """:func:`key_hashes` in Python: the reference of
    ``tide.format._ccore.index_key_hashes_ascii`` (and the path of non-ASCII keys)."""
    count = len(keys)
    if not count:
        return []
    width = len(keys[0])
    matrix = b"".join(keys)
    if not width or len(matrix) != width * count or max(map(len, keys)) != width:
        return index_key_hashes(keys, prefix)  # different lengths
    if not (matrix.isascii() and prefix.isascii()):
        return index_key_hashes(keys, prefix)
    shared = _shared_columns(matrix, width, count)
    ones = int.from_bytes(_ONE_LANE * count, "big")
    mask = ones * _U32
    acc = ones * _unsigned_hash(prefix + matrix[:shared])
    lanes = bytearray(8 * count)
    for step, column in enumerate(range(shared, width)):
        lanes[7::8] = matrix[column::width]
        acc = acc * 31 + int.from_bytes(lanes, "big")
        if step % _LANE_MASK_EVERY == _LANE_MASK_EVERY - 1:
            acc &= mask
    return _lanes_to_list(_abs_lanes(acc & mask, ones), count)


def _shared_columns(matrix: bytes, width: int, count: int) -> int:
    """How many leading columns hold the same byte in every key."""
    column = 0
    while column < width and matrix[column::width] == matrix[column : column + 1] * count:
        column += 1
    return column


def _unsigned_hash(ascii_key: bytes) -> int:
    h = 0
    for unit in ascii_key:
        h = (h * 31 + unit) & _U32
    return h


def _abs_lanes(acc: int, ones: int) -> int:
    """Each 32-bit lane (in 64) read as a signed int, its absolute value; Integer.MIN_VALUE
    (whose absolute value Java leaves negative) becomes 0, as RocketMQ says."""
    negative = (acc >> 31) & ones  # 1 in the lanes whose sign bit is set
    acc = (acc ^ (negative * _U32)) + negative  # those lanes: 2^32 - h, at most 2^31
    minimum = (acc >> 31) & ones  # exactly 2^31: was Integer.MIN_VALUE
    return acc ^ (minimum << 31)


def _lanes_to_list(acc: int, count: int) -> list[int]:
    """The low 32 bits of each 64-bit lane, first lane first."""
    lanes = acc.to_bytes(8 * count, "big")
    low = bytearray(4 * count)
    for byte in range(4):
        low[byte::4] = lanes[4 + byte :: 8]
    values = array("I")
    values.frombytes(low)
    if _LITTLE:
        values.byteswap()
    return values.tolist()
