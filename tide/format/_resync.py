"""Telling a torn tail from corruption.

After a crash, the bytes past the last complete record are a *torn tail*: a clean end.
An invalid record that is followed by valid data is *corruption* and must be reported.
:func:`find_next_record` looks for that valid data: a magic number at a position whose
record is complete, passes its CRC and names its own position in ``physical_offset``
(so a stray byte pattern inside a body cannot pass).
"""

from __future__ import annotations

import mmap
import struct

from tide.format._record import MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2, ScanKind, scan_record

_MAGICS = tuple(struct.pack(">i", m) for m in (MESSAGE_MAGIC_V1, MESSAGE_MAGIC_V2))
MAX_RESYNC_CANDIDATES = 100_000


def find_next_record(
    buf: bytes | bytearray | mmap.mmap, start: int, limit: int, base_offset: int
) -> int:
    """Position (relative to ``buf``) of the first valid record after ``start``, or -1.

    ``base_offset`` is the commitlog offset of ``buf[0]``. Looks at no more than
    :data:`MAX_RESYNC_CANDIDATES` magic-number candidates.
    """
    find = buf.find
    checked = 0
    positions = {magic: find(magic, start + 1, limit) for magic in _MAGICS}
    while checked < MAX_RESYNC_CANDIDATES:
        live = [(p, m) for m, p in positions.items() if p >= 0]
        if not live:
            return -1
        magic_pos, magic = min(live)
        record_pos = magic_pos - 4
        if record_pos > start:
            scan = scan_record(buf, record_pos, limit, expected_offset=base_offset + record_pos)
            if scan.kind is ScanKind.RECORD:
                return record_pos
        checked += 1
        positions[magic] = find(magic, magic_pos + 1, limit)
    return -1
