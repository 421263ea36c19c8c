"""Memory-mapped files with wrote / committed / flushed positions (RocketMQ's MappedFile).

Shared by every file family that is appended through a mapping: commitlog segments
(storage), consume queue segments and index files (dispatch).
"""

from tide.mapped._mapped_file import (
    PAGE_BYTES,
    MappedFile,
    read_through_file,
    reads_through_file,
)

__all__ = ["PAGE_BYTES", "MappedFile", "read_through_file", "reads_through_file"]
