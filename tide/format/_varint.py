"""Protobuf's base-128 varints, written by hand where a hot answer is framed by hand.

An int64 or int32 field is written as a varint: 7 bits a byte, the low group first, the
high bit set on every byte but the last; a negative value as its 64-bit two's complement
(so always ten bytes). A packed repeated field's payload is its values' varints back to
back. Example: 300 is ``ac 02`` (0b10_0101100: ``0x2c | 0x80``, then ``0x02``), and the
packed payload of ``[1, 300, -1]`` is ``01 ac 02 ff ff ff ff ff ff ff ff ff 01``.

``packed_varints`` runs in the compiled core (``_ccore.packed_varints``: one pass into
one buffer) when it is built, else :func:`packed_varints_python`; tests/format/
test_ccore_varint.py holds the two to each other and to protobuf's own bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tide.format import _core

_UINT64_MASK = (1 << 64) - 1
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


def varint(value: int) -> bytes:
    """``value`` as protobuf writes an int64/int32/uint field: base 128, low group
    first; a negative number as its 64-bit two's complement (ten bytes)."""
    value &= _UINT64_MASK
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def packed_varints(values: Sequence[int]) -> bytes:
    """The payload of a packed repeated int64/int32 field holding ``values``
    (OverflowError for a value outside int64, TypeError for a non-int)."""
    compiled = _compiled_packed_varints
    if compiled is not None:
        return compiled(values)
    return packed_varints_python(values)


def packed_varints_python(values: Sequence[int]) -> bytes:
    """:func:`packed_varints` in Python (the compiled core's reference)."""
    out = bytearray()
    for index, value in enumerate(values):
        if not isinstance(value, int):
            raise TypeError(
                f"packed_varints: values[{index}] is {type(value).__name__}, not an int"
            )
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise OverflowError(f"packed_varints: values[{index}] is outside int64")
        out += varint(value)
    return bytes(out)


_compiled_packed_varints: Callable[[Sequence[int]], bytes] | None = (
    None if _core.ccore is None else _core.ccore.packed_varints
)
