"""Small durable files: atomic JSON with a ``.bak`` fallback, directory fsync, and the
free space of a store's disk.

Used by the storage (topics.json, consumerOffset.json, queue_offsets.json) and the
dispatch service (its progress file).
"""

from tide.files._fsync import fsync_dir
from tide.files._json import (
    MAX_CONFIG_FILE_BYTES,
    ConfigFileError,
    ConfigFormatError,
    ConfigLimitError,
    load_json_with_fallback,
    parse_config_bytes,
    parse_config_json,
    write_file_atomically,
    write_json_atomically,
    write_json_bytes_atomically,
)
from tide.files._lock import FileLock, FileLockedError
from tide.files._space import (
    DiskSpace,
    OutOfSpaceError,
    allocate_file,
    check_room,
    describe_space,
    disk_space,
    is_out_of_space,
)

__all__ = [
    "MAX_CONFIG_FILE_BYTES",
    "ConfigFileError",
    "ConfigFormatError",
    "ConfigLimitError",
    "DiskSpace",
    "FileLock",
    "FileLockedError",
    "OutOfSpaceError",
    "allocate_file",
    "check_room",
    "describe_space",
    "disk_space",
    "fsync_dir",
    "is_out_of_space",
    "load_json_with_fallback",
    "parse_config_bytes",
    "parse_config_json",
    "write_file_atomically",
    "write_json_atomically",
    "write_json_bytes_atomically",
]
