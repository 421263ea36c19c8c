"""What the kernel says of this process's mappings (/proc/self/smaps)."""

from __future__ import annotations

from pathlib import Path

PAGE_BYTES = 4096


def dirty_pages(path: Path) -> int:
    """Pages of this process's mapping of ``path`` the kernel counts dirty (Shared_Dirty
    plus Private_Dirty: written through the mapping and not written back since)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for at, line in enumerate(lines):
        if line.endswith(" " + str(path)):
            dirty_kib = 0
            for field in lines[at + 1 :]:
                name, colon, value = field.partition(":")
                if not colon or " " in name:  # the next mapping's header line
                    break
                if name in ("Shared_Dirty", "Private_Dirty"):
                    dirty_kib += int(value.split()[0])
            return dirty_kib * 1024 // PAGE_BYTES
    raise AssertionError(f"{path} is not mapped by this process")
