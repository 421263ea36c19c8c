"""``spark.read.format("tide-commitlog").load(path)``: commitlog segments read directly.

``path`` is a commitlog directory, or a store root holding ``commitlog/`` (local or a
mounted shared file system). One Spark partition per segment file. The records are
decoded and checked (CRC included) by ``tide.commitlog``'s walker, which tells a torn
tail (the clean end after a crash, read up to and logged) from corruption (the read
fails, as ``tide store verify`` exits 1) by the same rule, with the abort file and queue
offset snapshot of the store root when ``path`` is one. An archived copy of the newest
segment may also be shorter than the others (copied while written, or cut off): it is
read as far as its records are whole. Records of hidden topics (retry, dead-letter,
schedule, timer and other system topics: tide.format's ``is_hidden_topic``) are left out
unless the option ``includeHidden`` is true.

The walk over one segment is ``tide.commitlog``'s own (``_SegmentWalk``), given this
module's segment chain so that a short newest segment is accepted.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from tide.commitlog import (
    CommitlogLayoutError,
    SegmentFile,
    TornTail,
    find_commitlog_dir,
    tail_marks_for,
)
from tide.commitlog._mapped import map_segment, segment_has_data
from tide.commitlog._reader import _SegmentWalk
from tide.format import (
    TailMarks,
    is_hidden_topic,
    make_msg_id,
    msg_id_prefix,
    parse_segment_name,
)
from tide.spark._options import _bool, _lower
from tide.spark._schema import BatchBuilder

log = logging.getLogger("tide.spark")

BATCH_ROWS = 4096


def archive_segments(path: str) -> tuple[Path, list[SegmentFile]]:
    """The commitlog directory under ``path`` and its segment chain (oldest first).

    Like ``tide.commitlog.scan_layout``, except that the newest segment with data may be
    shorter than the others (a truncated copy; empty preallocated segments may follow)."""
    # Raises NotAStoreError (a CommitlogLayoutError) for a directory that is no store.
    directory = find_commitlog_dir(Path(path.removeprefix("file://").removeprefix("file:")))
    segments = []
    for entry in sorted(directory.iterdir()):
        start = parse_segment_name(entry.name)
        if start is None:
            log.warning("ignoring %s: not a segment file", entry)
            continue
        if not entry.is_file() or entry.stat().st_size == 0:
            raise CommitlogLayoutError(f"segment {entry} is not a regular file with data")
        segments.append(SegmentFile(entry, start, entry.stat().st_size))
    segments.sort(key=lambda s: s.start_offset)
    if not segments:
        raise CommitlogLayoutError(
            f"{directory} holds no commitlog segment files: an empty store, nothing to read"
        )
    if segments:
        size = max(s.size for s in segments)
        if segments[0].start_offset % size:
            raise CommitlogLayoutError(
                f"{segments[0].path.name} does not start at a multiple of the segment size {size}"
            )
        for index, prev in enumerate(segments):
            later = segments[index + 1 :]
            if prev.size != size and any(segment_has_data(s) for s in later):
                raise CommitlogLayoutError(
                    f"segment {prev.path.name} is {prev.size} bytes, not {size}: only the "
                    "newest segment with data may be short"
                )
        for prev, cur in itertools.pairwise(segments):
            if cur.start_offset != prev.start_offset + size:  # sizes checked above
                raise CommitlogLayoutError(
                    f"the segment chain breaks between {prev.path.name} and {cur.path.name}"
                )
    return directory, segments


@dataclass
class SegmentPartition(InputPartition):
    """One segment; the whole chain comes along to tell a torn tail from corruption."""

    segments: tuple[tuple[str, int, int], ...]
    index: int
    broker_name: str | None
    check_crc: bool
    marks: TailMarks
    # Also the records of hidden topics (retry, dead-letter, schedule, timer, ...).
    include_hidden: bool = False


def read_segment(partition: SegmentPartition) -> Iterator[pa.RecordBatch]:
    segments = [SegmentFile(Path(p), start, size) for p, start, size in partition.segments]
    segment = segments[partition.index]
    builder = BatchBuilder(archive=True, broker_name=partition.broker_name)
    prefixes: dict[object, str] = {}
    hidden: dict[str, bool] = {}  # per topic: left out (a few topics, many records)

    def torn(tail: TornTail) -> None:
        log.warning(
            "%s: torn tail at offset %d (%d bytes: %s); the data ends there",
            segment.path,
            tail.offset,
            tail.bytes,
            tail.reason,
        )

    with map_segment(segment) as mm:
        walk = _SegmentWalk(
            segments, partition.index, mm, partition.check_crc, torn, partition.marks
        )
        for at in walk.records(0):
            record = at.record
            if not partition.include_hidden:
                skip = hidden.get(record.topic)
                if skip is None:
                    skip = hidden[record.topic] = is_hidden_topic(record.topic)
                if skip:
                    continue
            prefix = prefixes.get(record.store_host)
            if prefix is None:
                prefix = prefixes[record.store_host] = msg_id_prefix(record.store_host)
            builder.add_record(record, make_msg_id(prefix, record.physical_offset))
            if len(builder) >= BATCH_ROWS:
                yield builder.flush()
    if len(builder):
        yield builder.flush()


class CommitlogReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        lowered = _lower(options)
        if not lowered.get("path"):
            raise CommitlogLayoutError(
                'give the commitlog directory: spark.read.format("tide-commitlog").load(path)'
            )
        self.path = lowered["path"]
        self.broker_name = lowered.get("brokername") or None
        self.check_crc = _bool(lowered, "checkCrc", True)
        self.include_hidden = _bool(lowered, "includeHidden", False)

    def partitions(self) -> Sequence[InputPartition]:
        directory, segments = archive_segments(self.path)
        chain = tuple((str(s.path), s.start_offset, s.size) for s in segments)
        marks = tail_marks_for(directory)
        return [
            SegmentPartition(
                chain, index, self.broker_name, self.check_crc, marks, self.include_hidden
            )
            for index in range(len(segments))
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SegmentPartition):
            return iter(())  # Spark's placeholder when there are no partitions
        return read_segment(partition)
