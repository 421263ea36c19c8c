import mmap
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from tide.format._columns import (
    CheckedRun,
    IntColumn,
    PatchedOffsets,
    PropertyColumns,
    RunColumns,
    ScanColumns,
    TagColumns,
)

# Typed stub of the compiled core (tide/format/_ccore.c); the pure-Python reference of
# each function is named in its docstring there and in docs/performance.md.

def scan_v4_run(
    buf: bytes | bytearray | memoryview,
    start: int,
    end: int,
    base_offset: int,
    max_record_bytes: int,
    check_crc: bool,
    window: int,
    /,
) -> ScanColumns: ...
def dispatch_properties(
    data: bytes | bytearray | memoryview,
    starts: Sequence[int],
    ends: Sequence[int],
    sizes: Sequence[int] | None = None,
    /,
) -> PropertyColumns: ...
def scan_run(
    data: bytes | bytearray | memoryview, max_body_bytes: int, max_records: int, /
) -> RunColumns | None: ...
def patch_run(
    data: bytearray | memoryview,
    sizes: Sequence[int],
    queue_keys: Sequence[Hashable | None],
    store_timestamp_positions: Sequence[int],
    table: dict[Hashable, int],
    physical_offset: int,
    now_ms: int,
    store_host: bytes,
    /,
) -> PatchedOffsets: ...
def replay_records(
    buf: bytes | bytearray | memoryview | mmap.mmap,
    pos: int,
    limit: int,
    base_offset: int,
    check_crc: bool,
    max_body_bytes: int,
    next_offsets: dict[tuple[str, int], int],
    /,
) -> tuple[int, int]: ...
def encode_run_v4(
    magic: int,
    topic_part: bytes,
    queue_ids: Sequence[int],
    bodies: Sequence[bytes],
    properties: Sequence[bytes],
    born_timestamp_ms: int,
    born_host: bytes,
    /,
) -> bytes: ...
def index_key_hashes_ascii(keys: Sequence[bytes], prefix: bytes, /) -> IntColumn | None: ...
def span_records(piece: bytes | bytearray | memoryview, offset: int, at_most: int, /) -> int: ...
def record_tags(records: bytes | bytearray | memoryview, count: int, /) -> TagColumns | None: ...
def v4_record_fields(
    records: bytes | bytearray | memoryview,
    count: int,
    decode_properties: Callable[[bytes], dict[str, str]],
    stored: bool = False,
    /,
) -> tuple[list[Any], ...] | None: ...
def put_index_keys(
    buf: bytearray | memoryview | mmap.mmap,
    slot_count: int,
    max_entries: int,
    key_hashes: Sequence[int],
    phy_offsets: Sequence[int],
    store_timestamps_ms: Sequence[int],
    fd: int,
    /,
) -> int: ...
def consume_queue_entries(
    commitlog_offsets: object, sizes: object, tags_codes: object, /
) -> bytes | None: ...

# s25-core
def check_run(
    data: bytes | bytearray | memoryview,
    max_body_bytes: int,
    max_records: int,
    resolve: Callable[[bytes, int], tuple[Hashable, int]],
    allowed_sys_flags: int,
    /,
) -> CheckedRun[Hashable] | bool | None: ...

# The gateway's produce path (services/gateway/produce.py; tide/format/_bodies_run.py).
def scan_bodies(
    request: bytes | bytearray | memoryview, max_body_bytes: int, /
) -> tuple[bytes, int] | None: ...
def encode_bodies_run(
    request: bytes | bytearray | memoryview,
    magic: int,
    topic_part: bytes,
    queue_id: int,
    unique_keys: list[str],
    uniq_key_name: bytes,
    born_ms: int,
    born_host: bytes,
    /,
) -> bytes: ...
def numbered_keys(head: str, first: int, count: int, /) -> list[str]: ...

# The dispatch apply's per-batch columns (s26-dispatch; tide/format/_dispatch_columns.py).
def queue_entry_runs(
    topics: object,
    queue_ids: object,
    sys_flags: object,
    queue_offsets: object,
    offsets: object,
    sizes: object,
    codes: object,
    /,
) -> list[tuple[str, int, int | Sequence[int], bytes]] | None: ...
def back_to_back_runs(
    offsets: object, positions: object, sizes: object, /
) -> list[tuple[int, int, int]] | None: ...

# The gateway's FIFO produce (s27-fifo; tide/format/_sharding_groups.py).
def sharding_groups(keys: object, count: int, /) -> list[tuple[int, list[int]]] | None: ...

# GetQueueEntries' span selection (s27-spans; tide/format/_entry_spans.py).
def entry_spans(
    entries: bytes | bytearray | memoryview | mmap.mmap,
    first_offset: int,
    max_count: int,
    tag_codes: object,
    max_bytes: int,
    next_offset: int,
    /,
) -> tuple[list[tuple[int, int, int]], int] | None: ...
def first_unwritten(entries: bytes | bytearray | memoryview | mmap.mmap, /) -> int: ...
def packed_varints(values: Sequence[int], /) -> bytes: ...
