"""The 4 KiB checkpoint file; only its first 40 bytes are used.

``physic_msg_timestamp 8 | logics_msg_timestamp 8 | index_msg_timestamp 8
| master_flushed_offset 8 | confirm_phy_offset 8``
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

CHECKPOINT_FILE_BYTES = 4096
_LAYOUT = struct.Struct(">qqqqq")


@dataclass(frozen=True, slots=True)
class Checkpoint:
    physic_msg_timestamp_ms: int = 0
    logics_msg_timestamp_ms: int = 0
    index_msg_timestamp_ms: int = 0
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    def pack(self) -> bytes:
        data = _LAYOUT.pack(
            self.physic_msg_timestamp_ms,
            self.logics_msg_timestamp_ms,
            self.index_msg_timestamp_ms,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        )
        return data + bytes(CHECKPOINT_FILE_BYTES - len(data))

    @classmethod
    def unpack(cls, data: bytes) -> Checkpoint:
        if len(data) < _LAYOUT.size:
            raise ValueError(f"checkpoint is {len(data)} bytes, needs at least {_LAYOUT.size}")
        return cls(*_LAYOUT.unpack_from(data, 0))
