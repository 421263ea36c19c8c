"""``config/delayOffset.json``: how far each delay level's queue has been delivered.

docs/formats.md, "config/delayOffset.json". RocketMQ's ``DelayOffsetSerializeWrapper``::

    {"dataVersion": {"counter": 3, "stateVersion": 0, "timestamp": <ms>},
     "offsetTable": {"1": 12, "3": 0}}

Keys are delay levels (fastjson writes them bare: ``{1:12}``), values the next queue offset
of ``SCHEDULE_TOPIC_XXXX`` queue ``level - 1`` to deliver. A level missing from the table
starts at 0. RocketMQ 4 files have no ``dataVersion``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tide.files import ConfigFormatError
from tide.format._config_json import INT64_MAX, DataVersion, as_object, int_key, show
from tide.format._delay_levels import MAX_DELAY_LEVELS

DELAY_OFFSET_FILE = "delayOffset.json"  # under config/


@dataclass(frozen=True, slots=True)
class DelayOffsets:
    offsets: Mapping[int, int] = field(default_factory=dict)  # level -> next queue offset
    data_version: DataVersion = field(default_factory=DataVersion)

    def __post_init__(self) -> None:
        for level, offset in self.offsets.items():
            if type(level) is not int or not 1 <= level <= MAX_DELAY_LEVELS:
                raise ConfigFormatError(
                    f"delay offset table: level {show(level)} must be 1..{MAX_DELAY_LEVELS}"
                )
            if type(offset) is not int or not 0 <= offset <= INT64_MAX:
                raise ConfigFormatError(
                    f"delay offset table: level {level} has offset {show(offset)}; "
                    "it must be a queue offset (0 or more)"
                )

    def offset(self, level: int) -> int:
        return self.offsets.get(level, 0)


def encode_delay_offsets(table: DelayOffsets) -> dict[str, object]:
    """The ``delayOffset.json`` document (levels in order, keys quoted)."""
    return {
        "dataVersion": table.data_version.to_json(),
        "offsetTable": {str(level): table.offsets[level] for level in sorted(table.offsets)},
    }


def decode_delay_offsets(raw: object) -> DelayOffsets:
    """Parse and check a ``delayOffset.json`` document."""
    doc = as_object(raw, "the document")
    table = as_object(doc.get("offsetTable", {}), "offsetTable")
    offsets = {
        int_key(key, "offsetTable", 1, MAX_DELAY_LEVELS): value for key, value in table.items()
    }
    if len(offsets) != len(table):
        raise ConfigFormatError("offsetTable names a delay level twice (as '1' and '01'?)")
    return DelayOffsets(
        offsets=offsets,  # type: ignore[arg-type]  # values are checked by __post_init__
        data_version=DataVersion.from_json(doc.get("dataVersion")),
    )
