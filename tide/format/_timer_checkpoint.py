"""The timer checkpoint: RocketMQ 5's ``config/timercheck``, one 4 KiB page.

docs/formats.md, "Timer checkpoint". Big-endian, the first 56 bytes used
(``TimerCheckpoint.flush``)::

    last_read_time_ms:i64  last_timer_log_flush_pos:i64  last_timer_queue_offset:i64
    master_timer_queue_offset:i64  state_version:i64  data_version_timestamp_ms:i64
    data_version_counter:i64

The last three (the data version) were added in a later RocketMQ 5 release; a 32-byte
encoding without them (``TimerCheckpoint.decode`` of an older master's) reads as zeros.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from tide.format._record import Buffer

TIMER_CHECKPOINT_FILE = "timercheck"  # under config/
TIMER_CHECKPOINT_FILE_BYTES = 4096  # one OS page, mapped whole
TIMER_CHECKPOINT_BYTES = 56
TIMER_CHECKPOINT_V1_BYTES = 32  # without the data version

_LAYOUT = struct.Struct(">qqqqqqq")
_V1 = struct.Struct(">qqqq")
assert _LAYOUT.size == TIMER_CHECKPOINT_BYTES
assert _V1.size == TIMER_CHECKPOINT_V1_BYTES


@dataclass(frozen=True, slots=True)
class TimerCheckpoint:
    last_read_time_ms: int = 0  # the wheel has fired every slot before this time
    last_timer_log_flush_pos: int = 0  # timer-log bytes below this were flushed
    last_timer_queue_offset: int = 0  # next timer-topic queue offset to file
    master_timer_queue_offset: int = 0  # a slave's copy of the master's
    state_version: int = 0
    data_version_timestamp_ms: int = 0
    data_version_counter: int = 0

    def pack(self) -> bytes:
        """The 56 bytes (``TimerCheckpoint.encode``), as a slave receives them."""
        return _LAYOUT.pack(
            self.last_read_time_ms,
            self.last_timer_log_flush_pos,
            self.last_timer_queue_offset,
            self.master_timer_queue_offset,
            self.state_version,
            self.data_version_timestamp_ms,
            self.data_version_counter,
        )

    def pack_file(self) -> bytes:
        """The whole 4 KiB file."""
        data = self.pack()
        return data + bytes(TIMER_CHECKPOINT_FILE_BYTES - len(data))

    @classmethod
    def unpack(cls, data: Buffer) -> TimerCheckpoint:
        """From a file or an encoding: 56 bytes or more, or the 32-byte older form."""
        if len(data) >= TIMER_CHECKPOINT_BYTES:
            return cls(*_LAYOUT.unpack_from(data, 0))
        if len(data) == TIMER_CHECKPOINT_V1_BYTES:
            return cls(*_V1.unpack_from(data, 0))
        raise ValueError(
            f"timer checkpoint is {len(data)} bytes; it needs {TIMER_CHECKPOINT_BYTES} "
            f"(or {TIMER_CHECKPOINT_V1_BYTES} from an older RocketMQ 5)"
        )
