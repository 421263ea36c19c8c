"""The column tuples the compiled core answers, named once.

Typing only (aliases, no code): the typed stub of the compiled core
(tide/format/_ccore.pyi), :mod:`tide.format._core` and the pure-Python references
(each names its twin) all spell an answer's columns with these, so the stub and the
references cannot drift apart.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable
from typing import TypeAlias, TypeVar

_Name = TypeVar("_Name", bound=Hashable)

# An integer column of a batch: an array('q') from the compiled scan (8 bytes a value, no
# int object made, freed or chased a record: docs/performance.md "The scan's integer
# columns"), a list from its pure-Python reference (which works in lists: converting
# would only slow it). Equal values either way; every reader takes both.
IntColumn: TypeAlias = "list[int] | array[int]"

# scan_v4_run: the stop, then positions, offsets, sizes, queue ids, queue offsets,
# sys_flags, store timestamps, topics, properties' starts (tide/format/_record_scan.py).
ScanColumns: TypeAlias = tuple[
    int,
    IntColumn,
    IntColumn,
    IntColumn,
    IntColumn,
    IntColumn,
    IntColumn,
    IntColumn,
    list[str],
    IntColumn,
]
# dispatch_properties: keys, tags, uniq_keys.
PropertyColumns: TypeAlias = tuple[list[bytes], list[bytes], list[bytes | None]]
# scan_run: starts, sizes, topics, queue ids, sys_flags, store timestamp positions.
RunColumns: TypeAlias = tuple[list[int], list[int], list[bytes], list[int], list[int], list[int]]
# patch_run: physical offsets, queue offsets.
PatchedOffsets: TypeAlias = tuple[list[int], list[int]]
# record_tags: each record's TOTALSIZE and TAGS ('' when absent).
TagColumns: TypeAlias = tuple[list[int], list[str]]
# check_run: sizes, queue keys ((name, queue id), None for a queue-less record), store
# timestamp positions; generic in the name resolve answers.
CheckedRun: TypeAlias = tuple[list[int], list[tuple[_Name, int] | None], list[int]]
