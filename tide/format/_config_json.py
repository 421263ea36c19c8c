"""Shared pieces of the ``config/*.json`` layouts: RocketMQ's DataVersion and typed fields.

RocketMQ writes these files with fastjson: fields in alphabetical order, null fields left
out, integer map keys bare (``{1:0}``; ``tide.files`` reads those). Tide writes the same
fields in the same order with quoted keys, and reads RocketMQ's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeVar

from tide.files import ConfigFormatError

_T = TypeVar("_T")
_SHOWN_CHARS = 40  # how much of a bad key or value an error message repeats
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
_KIND_NAMES = {int: "an integer", bool: "true or false", str: "a string", list: "a list"}
_INT_KEY = re.compile(r"-?[0-9]{1,19}")


@dataclass(frozen=True, slots=True)
class DataVersion:
    """RocketMQ 5's ``DataVersion``: bumped on every change of a table."""

    state_version: int = 0
    timestamp_ms: int = 0
    counter: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "counter": self.counter,
            "stateVersion": self.state_version,
            "timestamp": self.timestamp_ms,
        }

    @classmethod
    def from_json(cls, raw: object) -> DataVersion:
        """``None`` (a RocketMQ 4 file without one) is the zero version."""
        if raw is None:
            return cls()
        where = "dataVersion"
        doc = as_object(raw, where)
        return cls(
            state_version=int_field(doc, where, "stateVersion", 0, 0, INT64_MAX),
            timestamp_ms=int_field(doc, where, "timestamp", 0, 0, INT64_MAX),
            counter=int_field(doc, where, "counter", 0, 0, INT64_MAX),
        )

    def next(self, now_ms: int) -> DataVersion:
        """``DataVersion.nextVersion``."""
        return DataVersion(self.state_version, now_ms, self.counter + 1)


def show(value: object) -> str:
    """``value`` for an error message, at most about 40 characters of it."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "..."


def as_object(raw: object, where: str) -> dict[str, object]:
    if not isinstance(raw, dict):
        raise ConfigFormatError(f"{where} must be a JSON object, got {show(raw)}")
    return raw


def typed_field(doc: dict[str, object], where: str, name: str, kind: type[_T], default: _T) -> _T:
    """``doc[name]`` of type ``kind`` (bool is not an int here), ``default`` when absent
    or null (fastjson leaves a primitive field at its default on null)."""
    value = doc.get(name)
    if value is None:
        return default
    if type(value) is not kind:
        what = _KIND_NAMES.get(kind, kind.__name__)
        raise ConfigFormatError(f"{where}: {name} is {show(value)}; it must be {what}")
    return value


def int_field(
    doc: dict[str, object], where: str, name: str, default: int, low: int, high: int
) -> int:
    value = typed_field(doc, where, name, int, default)
    if not low <= value <= high:
        raise ConfigFormatError(f"{where}: {name} is {value}; it must be {low}..{high}")
    return value


def int_key(key: str, where: str, low: int, high: int) -> int:
    """A map key holding an int (fastjson's ``Map<Integer, _>``)."""
    if _INT_KEY.fullmatch(key) is None:
        raise ConfigFormatError(f"{where}: key {show(key)} is not an integer")
    value = int(key)
    if not low <= value <= high:
        raise ConfigFormatError(f"{where}: key {value} must be {low}..{high}")
    return value
