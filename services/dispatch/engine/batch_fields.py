"""What dispatch needs from the properties of a batch of records, without decoding them.

A record's properties are ``name \\x01 value \\x02`` repeated (docs/formats.md);
:func:`tide.format.decode_properties` splits them on ``\\x02``, skips items without a
``\\x01``, splits each item at its first ``\\x01``, and keeps the last value of a name.
Dispatch only needs three of them (``KEYS``, ``TAGS``, ``UNIQ_KEY``), for every record of
a batch. :func:`dispatch_properties` finds them for the whole batch with one regular
expression over the properties joined with a record mark (``\\x02\\x00``): one match per
record, whose repeated groups keep the last value of each name, exactly as the decoder
does. A batch in which a record's properties hold the mark itself (an item starting with
``\\x00``, which no producer writes) is parsed record by record instead.

Most batches are simpler still: every record holds the same names in the same order
(one producer, one client library), say ``KEYS`` alone. :func:`_same_names` reads such a
batch with a few counts and splits over the joined properties, no regular expression,
and gives up (the regex then runs) at anything else.

Values stay bytes: they are UTF-8 (invalid sequences read as U+FFFD, as the decoder
reads them), and the index hashes ``topic#key`` from its bytes when it is ASCII.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import accumulate, repeat
from operator import getitem
from typing import Any, NamedTuple, cast

from tide.format import _core, tags_code
from tide.format._dispatch_columns import record_ends_python

_KEYS = b"KEYS"
_TAGS = b"TAGS"
_UNIQ_KEY = b"UNIQ_KEY"
_RECORD_MARK = b"\x02\x00"
_JOIN = _RECORD_MARK + b"\x02"  # each record: the mark, then its items, each after \x02
# One record: the mark, then items. KEYS and TAGS capture the value; UNIQ_KEY captures the
# name too, so that an empty value (indexed) differs from none (not indexed). Any other
# item: one not starting with \x00 (so the next record's mark is never taken as an item),
# or an empty one (followed by \x02 or the end). The runs of value bytes are possessive
# (``*+``): an item always runs to the next \x02, so giving bytes back never helps, and
# not saving a backtracking point per byte makes the scan ~1.3x faster. (Not the
# repetition of items: on CPython 3.11, a possessive repeat around capturing groups can
# fail with "The span of capturing group is wrong".)
_ALTERNATIVES = (
    rb"KEYS\x01([^\x02]*+)",
    rb"TAGS\x01([^\x02]*+)",
    rb"(UNIQ_KEY\x01[^\x02]*+)",
)


def _record_items(present: tuple[bool, bool, bool]) -> re.Pattern[bytes]:
    """The record regex capturing the names that are ``present`` (KEYS, TAGS, UNIQ_KEY):
    a batch without UNIQ_KEY (say) needs no alternative nor group for it."""
    named = b"".join(alt + b"|" for alt, on in zip(_ALTERNATIVES, present, strict=True) if on)
    return re.compile(rb"\x02\x00(?:\x02(?:" + named + rb"[^\x00\x02][^\x02]*+|(?=\x02|\Z)))*")


_PATTERNS = {
    (k, t, u): _record_items((k, t, u))
    for k in (False, True)
    for t in (False, True)
    for u in (False, True)
}
_UNIQ_VALUE_POS = len(_UNIQ_KEY) + 1
_WANTED = frozenset((_KEYS, _TAGS, _UNIQ_KEY))
# ``data[a:b]`` as a function (faster in map than ``data.__getitem__``, a slot wrapper)
_slice_of = cast("Callable[[bytes, slice], bytes]", getitem)
_compiled = _core.dispatch_properties


class DispatchProperties(NamedTuple):
    """Per record, as bytes: the KEYS value, the TAGS value (``b""`` when absent or
    empty: neither is indexed nor tagged), and the UNIQ_KEY value or None when absent."""

    keys: list[bytes]
    tags: list[bytes]
    uniq_keys: list[bytes | None]


def dispatch_properties(props: Sequence[bytes]) -> DispatchProperties:
    """KEYS, TAGS and UNIQ_KEY of each record (see the module docstring)."""
    return properties_in(b"".join(props), list(accumulate(map(len, props), initial=0)))


def properties_in(data: bytes, bounds: Sequence[int]) -> DispatchProperties:
    """:func:`dispatch_properties` of the properties at ``data[bounds[i]:bounds[i+1]]``
    for every i (``bounds``: where they start, then where the last ends)."""
    return properties_between(data, bounds[:-1], bounds[1:])


def properties_between(
    data: bytes, starts: Sequence[int], ends: Sequence[int]
) -> DispatchProperties:
    """:func:`dispatch_properties` of the properties at ``data[starts[i]:ends[i]]`` (the
    compiled core's, unless the pure-Python path runs)."""
    if _compiled is not None:
        return DispatchProperties(*_compiled(data, starts, ends))
    return properties_between_python(data, starts, ends)


def properties_of_records(
    data: bytes, starts: Sequence[int], positions: Sequence[int], sizes: Sequence[int]
) -> DispatchProperties:
    """:func:`properties_between` of records whose properties end where the record does
    (``positions[i] + sizes[i]``, a ``RecordBatch``'s): the compiled core adds them up
    as it reads, without a list of the ends made for the call; the pure-Python path
    makes it (``record_ends_python``) and runs :func:`properties_between_python`."""
    compiled = _compiled_records
    if compiled is not None:
        return DispatchProperties(*compiled(data, starts, positions, sizes))
    return properties_between_python(data, starts, record_ends_python(positions, sizes))


_compiled_records = None if _core.ccore is None else _core.ccore.dispatch_properties


def properties_between_python(
    data: bytes, starts: Sequence[int], ends: Sequence[int]
) -> DispatchProperties:
    """:func:`properties_between` in Python: the reference of
    ``tide.format._ccore.dispatch_properties``."""
    count = len(starts)
    if not count:
        return DispatchProperties([], [], [])
    props = list(map(_slice_of, repeat(data), map(slice, starts, ends)))
    same = _same_names(props)
    if same is not None:
        return same
    joined = _JOIN + _JOIN.join(props)
    # A match starts at every mark and its items stop only at a mark or the end: so there
    # are as many matches as records exactly when no properties hold the mark.
    # Only the names found somewhere in the batch are captured (the others are in no
    # record): fewer groups, smaller tuples, none at all with one name.
    present = (_KEYS + b"\x01" in joined, _TAGS + b"\x01" in joined, _UNIQ_KEY + b"\x01" in joined)
    found: list[Any] = _PATTERNS[present].findall(joined)
    columns: list[list[bytes]]
    if len(found) != count:
        found = [_one(data[start:end]) for start, end in zip(starts, ends, strict=True)]
        columns = [list(column) for column in zip(*found, strict=True)]
    else:
        groups = present.count(True)
        if groups == 1:
            some = [found]
        elif groups:
            some = [list(column) for column in zip(*found, strict=True)]
        else:
            some = []
        empty = [b""] * count
        columns = [some.pop(0) if on else empty for on in present]
    keys, tags, uniq = columns
    uniq_keys: list[bytes | None] = (
        [u[_UNIQ_VALUE_POS:] if u else None for u in uniq] if any(uniq) else [None] * len(uniq)
    )
    return DispatchProperties(keys, tags, uniq_keys)


def _same_names(props: list[bytes]) -> DispatchProperties | None:
    """The batch's KEYS, TAGS and UNIQ_KEY when every record's properties are the items
    of the first record's names, in that order, each ``name \\x01 value \\x02`` with
    neither \\x00, \\x01 nor \\x02 in the value; None when they are not.

    The records are joined after a \\x00 each and cut at every \\x02: with ``k`` names,
    item ``j`` of every record is then every ``k``-th piece from ``j``. Counts prove the
    shape without a step per record: \\x00 only as the record marks, \\x02 and \\x01
    ``k`` times a record, and each column's pieces, joined after a \\x02 each, holding
    ``\\x02 name \\x01`` (and the mark, in the first column) once per record; or, when
    every piece of a column is the same (one tag), the first one starting with it.
    """
    count = len(props)
    first = props[0]
    if not first.endswith(b"\x02"):
        return None
    names = [item.partition(b"\x01")[0] for item in first[:-1].split(b"\x02")]
    width = len(names)
    joined = b"\x00" + b"\x00".join(props)
    if not (
        joined.count(b"\x00") == count
        and joined.count(b"\x02") == width * count
        and joined.count(b"\x01") == width * count
        and joined.endswith(b"\x02")
    ):
        return None
    values = _one_name(joined, names[0], count) if width == 1 else _names(joined, names, count)
    if values is None:
        return None
    empty = [b""] * count
    uniq = values.get(_UNIQ_KEY)
    return DispatchProperties(
        values.get(_KEYS, empty),
        values.get(_TAGS, empty),
        [None] * count if uniq is None else cast("list[bytes | None]", uniq),
    )


def _one_name(joined: bytes, name: bytes, count: int) -> dict[bytes, list[bytes]] | None:
    """:func:`_same_names` of records of one item each: every record mark after the first
    follows a \\x02 and precedes the name, so each record is ``name \\x01 value \\x02``
    and one split gives the values."""
    mark = b"\x00" + name + b"\x01"
    if joined.count(b"\x02\x00") != count - 1 or joined.count(mark) != count:
        return None
    if name not in _WANTED:
        return {}
    return {name: joined[len(mark) : -1].split(b"\x02" + mark)}


def _names(joined: bytes, names: list[bytes], count: int) -> dict[bytes, list[bytes]] | None:
    """:func:`_same_names` of records of several items, a column at a time."""
    width = len(names)
    pieces = joined.split(b"\x02")
    values: dict[bytes, list[bytes]] = {}
    for column, name in enumerate(names):
        head = b"\x02\x00" + name + b"\x01" if column == 0 else b"\x02" + name + b"\x01"
        items = pieces[column : width * count : width]
        if items.count(items[0]) == count:  # one value (one tag): check it once
            if not items[0].startswith(head[1:]):
                return None
            if name in _WANTED:
                values[name] = [items[0][len(head) - 1 :]] * count
            continue
        joined_items = head[:1] + head[:1].join(items)
        if joined_items.count(head) != count:
            return None
        if name in _WANTED:  # (the last item of a name wins)
            values[name] = joined_items[len(head) :].split(head)
    return values


def _one(props: bytes) -> tuple[bytes, bytes, bytes]:
    """One record's (KEYS, TAGS, b"UNIQ_KEY\\x01" + value) as the batch regex gives them."""
    values: dict[bytes, bytes] = {}
    for item in props.split(b"\x02"):
        name, sep, value = item.partition(b"\x01")
        if sep and name in (_KEYS, _TAGS, _UNIQ_KEY):
            values[name] = value
    uniq = values.get(_UNIQ_KEY)
    return (
        values.get(_KEYS, b""),
        values.get(_TAGS, b""),
        b"" if uniq is None else _UNIQ_KEY + b"\x01" + uniq,
    )


def split_keys(value: bytes, limit: int) -> list[bytes]:
    """``[k for k in value.split(" ") if k][:limit]`` on the bytes of KEYS."""
    return [key for key in value.split(b" ") if key][:limit]


class TagsCodes(dict[bytes, int]):
    """TAGS value bytes -> :func:`tide.format.tags_code` of its text (tags repeat)."""

    _MAX = 4096

    def __missing__(self, key: bytes) -> int:
        if len(self) >= self._MAX:
            self.clear()
        code = tags_code(key.decode("utf-8", "replace")) if key else 0
        self[key] = code
        return code
