"""Segment file names: the 20-digit zero-padded start offset."""

from __future__ import annotations

NAME_DIGITS = 20


def segment_name(start_offset: int) -> str:
    assert start_offset >= 0, start_offset
    return f"{start_offset:0{NAME_DIGITS}d}"


def parse_segment_name(name: str) -> int | None:
    """The start offset a file name stands for, or None for a file that is no segment."""
    if len(name) != NAME_DIGITS or not name.isdigit():
        return None
    return int(name)
