"""Build commitlog directories for tests, the way the real writer lays them out.

Records go back to back; when a record plus 8 bytes does not fit in the rest of a
segment, a blank marker fills the rest and the record starts the next segment
(docs/formats.md, "End of segment"). Segments are zero-filled, preallocated files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tide.format import (
    BLANK_MARKER_BYTES,
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    HostAddress,
    encode_properties,
    encode_record,
    is_queue_less,
    pack_host,
    patch_record,
    record_size,
    segment_name,
    write_blank,
)

SEGMENT_SIZE = 64 * 1024
STORE_HOST = HostAddress("10.0.0.7", 10911)
BORN_HOST = HostAddress("192.168.1.20", 53012)
FIRST_STORE_TS_MS = 1_700_000_000_000


@dataclass(frozen=True, slots=True)
class Written:
    offset: int
    size: int
    topic: str
    queue_id: int
    queue_offset: int
    body: bytes
    properties: dict[str, str]
    store_timestamp_ms: int

    @property
    def end(self) -> int:
        return self.offset + self.size


class StoreBuilder:
    """Appends records in memory; :meth:`write` puts the segment files on disk."""

    def __init__(self, root: Path, segment_size: int = SEGMENT_SIZE, first_offset: int = 0):
        assert first_offset % segment_size == 0
        self.root = root
        self.commitlog = root / "commitlog"
        self.segment_size = segment_size
        self.pos = first_offset
        self.segments: dict[int, bytearray] = {first_offset: bytearray(segment_size)}
        self.queue_offsets: dict[tuple[str, int], int] = {}
        self.records: list[Written] = []
        self.blanks: list[int] = []

    def bytes_left(self) -> int:
        return self.segment_size - self.pos % self.segment_size

    def append(
        self,
        topic: str = "TopicTest",
        body: bytes = b"hello",
        *,
        queue_id: int = 0,
        properties: dict[str, str] | None = None,
        born_host: HostAddress = BORN_HOST,
        store_host: HostAddress = STORE_HOST,
        sys_flag: int = 0,
        flag: int = 0,
    ) -> Written:
        props = dict(properties or {})
        sys_flag |= SYSFLAG_BORN_HOST_V6 if born_host.is_v6 else 0
        sys_flag |= SYSFLAG_STORE_HOST_V6 if store_host.is_v6 else 0
        encoded = encode_record(
            topic, topic.encode(), queue_id, body, encode_properties(props), flag, sys_flag,
            FIRST_STORE_TS_MS - 5, pack_host(born_host), pack_host(store_host),
        )  # fmt: skip
        size = len(encoded.data)
        assert size + BLANK_MARKER_BYTES <= self.segment_size, "record too large for a segment"
        if size + BLANK_MARKER_BYTES > self.bytes_left():
            self.roll()
        buf, at = self._buffer(self.pos)
        buf[at : at + size] = encoded.data
        queue_offset = self._next_queue_offset(topic, queue_id, sys_flag)
        store_ts = FIRST_STORE_TS_MS + len(self.records)
        patch_record(buf, at, encoded.store_timestamp_pos, queue_offset, self.pos, store_ts)
        written = Written(self.pos, size, topic, queue_id, queue_offset, body, props, store_ts)
        self.records.append(written)
        self.pos += size
        return written

    def fill_to_reserve(self, topic: str = "TopicTest") -> Written:
        """Append a record that ends exactly 8 bytes (the blank reserve) before the segment end."""
        body_len = self.bytes_left() - BLANK_MARKER_BYTES - record_size(0, len(topic), 0)
        assert body_len >= 0, "not enough room left in this segment"
        written = self.append(topic, b"f" * body_len)
        assert self.bytes_left() == BLANK_MARKER_BYTES
        return written

    def append_many(self, count: int, topic: str = "TopicTest", body_bytes: int = 100) -> None:
        for i in range(count):
            self.append(topic, f"{i:06d}".encode().ljust(body_bytes, b"."), queue_id=i % 4)

    def write(self, *, preallocate_next: bool = True) -> Path:
        """Write every segment (and a zero-filled next one, as the allocator would)."""
        self.commitlog.mkdir(parents=True, exist_ok=True)
        self._buffer(self.pos)  # the segment being written (maybe empty after a roll)
        if preallocate_next:
            self._buffer(self.pos - self.pos % self.segment_size + self.segment_size)
        for start, data in sorted(self.segments.items()):
            (self.commitlog / segment_name(start)).write_bytes(data)
        return self.commitlog

    def segment_path(self, offset: int) -> Path:
        return self.commitlog / segment_name(offset - offset % self.segment_size)

    def damage(self, offset: int, data: bytes) -> None:
        """Overwrite written bytes at a commitlog offset (after :meth:`write`)."""
        poke(self.segment_path(offset), offset % self.segment_size, data)

    def read(self, offset: int, length: int) -> bytes:
        return peek(self.segment_path(offset), offset % self.segment_size, length)

    def roll(self) -> None:
        """End the current segment with a blank marker, as the writer does when full."""
        buf, at = self._buffer(self.pos)
        write_blank(buf, at, self.bytes_left())
        self.blanks.append(self.pos)
        self.pos += self.bytes_left()

    def _buffer(self, offset: int) -> tuple[bytearray, int]:
        start = offset - offset % self.segment_size
        buf = self.segments.get(start)
        if buf is None:
            buf = self.segments[start] = bytearray(self.segment_size)
        return buf, offset - start

    def _next_queue_offset(self, topic: str, queue_id: int, sys_flag: int) -> int:
        if is_queue_less(sys_flag):
            return 0
        key = (topic, queue_id)
        offset = self.queue_offsets.get(key, 0)
        self.queue_offsets[key] = offset + 1
        return offset


def poke(path: Path, pos: int, data: bytes) -> None:
    """Overwrite bytes of a file in place (to damage a segment)."""
    with path.open("r+b") as f:
        f.seek(pos)
        f.write(data)


def peek(path: Path, pos: int, length: int) -> bytes:
    with path.open("rb") as f:
        f.seek(pos)
        return f.read(length)
