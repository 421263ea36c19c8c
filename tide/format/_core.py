"""Which implementation of the per-message loops runs: compiled or pure Python.

``tide.format._ccore`` (C through the CPython API, built by the package build) is used
when it imports; ``TIDE_NO_EXTENSIONS=1`` forces the pure-Python references instead (as
aiokafka's ``AIOKAFKA_NO_EXTENSIONS`` does), and a failed import falls back to them with
one warning. Both give the same results: tests/format/test_ccore.py holds them equal on
random, damaged and edge-case input (docs/performance.md, "The compiled core").
"""

from __future__ import annotations

import mmap
import os
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TypeAlias

from tide.format._columns import (
    IntColumn,
    PatchedOffsets,
    PropertyColumns,
    RunColumns,
    ScanColumns,
)

NO_EXTENSIONS_ENV = "TIDE_NO_EXTENSIONS"


class ExtensionWarning(RuntimeWarning):
    """The compiled core is missing: Tide runs its pure-Python path (slower, same results)."""


def _load() -> ModuleType | None:
    if os.environ.get(NO_EXTENSIONS_ENV, "") not in ("", "0"):
        return None
    try:
        from tide.format import _ccore
    except ImportError as exc:  # not built (an install without a C compiler) or broken
        warnings.warn(
            f"tide's compiled core did not import ({exc}); running the pure-Python path "
            f"(set {NO_EXTENSIONS_ENV}=1 to choose it and silence this warning)",
            ExtensionWarning,
            stacklevel=2,
        )
        return None
    return _ccore


# Imported once per process: the warning, if any, is given once, at start-up.
ccore = _load()


# The answers' column tuples: tide/format/_columns.py (the stub's too).
ScanV4Run: TypeAlias = Callable[[bytes, int, int, int, int, bool, int], ScanColumns]
DispatchProperties: TypeAlias = Callable[[bytes, Sequence[int], Sequence[int]], PropertyColumns]
ScanRun: TypeAlias = Callable[[bytes | bytearray, int, int], RunColumns | None]
# patch_run's arguments are typed where it is wrapped (tide.format._record_run).
PatchRun: TypeAlias = Callable[..., PatchedOffsets]
ReplayRecords: TypeAlias = Callable[
    [
        bytes | bytearray | memoryview | mmap.mmap,
        int,
        int,
        int,
        bool,
        int,
        dict[tuple[str, int], int],
    ],
    tuple[int, int],
]
EncodeRunV4: TypeAlias = Callable[
    [int, bytes, Sequence[int], Sequence[bytes], Sequence[bytes], int, bytes], bytes
]
# The compiled functions, typed, or None when the pure-Python path runs.
scan_v4_run: ScanV4Run | None = None if ccore is None else ccore.scan_v4_run
dispatch_properties: DispatchProperties | None = (
    None if ccore is None else ccore.dispatch_properties
)
scan_run: ScanRun | None = None if ccore is None else ccore.scan_run
patch_run: PatchRun | None = None if ccore is None else ccore.patch_run
replay_records: ReplayRecords | None = None if ccore is None else ccore.replay_records
encode_run_v4: EncodeRunV4 | None = None if ccore is None else ccore.encode_run_v4
# check_run's arguments and answer are typed where it is wrapped (tide.format._run_check).
check_run: Callable[..., object] | None = None if ccore is None else ccore.check_run
index_key_hashes_ascii: Callable[[Sequence[bytes], bytes], IntColumn | None] | None = (
    None if ccore is None else ccore.index_key_hashes_ascii
)


def using_extensions() -> bool:
    """Whether the compiled core runs (for logs, status and benchmarks)."""
    return ccore is not None
