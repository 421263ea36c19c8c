"""The runtime settings a service applies for serving: collector and allocator."""

from __future__ import annotations

import subprocess
import sys

from tide.server._gc import YOUNG_THRESHOLD_OBJECTS
from tide.server._malloc import tune_malloc


def test_gc_tuning_freezes_startup_objects_and_raises_the_young_threshold() -> None:
    # In a child process: freezing and thresholds are process-wide.
    code = (
        "import gc; from tide.server._gc import tune_gc_for_serving; "
        "before = gc.get_freeze_count(); tune_gc_for_serving(); "
        "print(gc.get_freeze_count() > before, gc.get_threshold()[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["True", str(YOUNG_THRESHOLD_OBJECTS)]


def test_glibc_accepts_the_allocator_thresholds() -> None:
    assert tune_malloc() is True  # this machine's Python runs on glibc
