"""Small durable files: atomic JSON with a ``.bak`` fallback, and directory fsync.

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
    parse_config_json,
    write_json_atomically,
)
from tide.files._lock import FileLock, FileLockedError

__all__ = [
    "MAX_CONFIG_FILE_BYTES",
    "ConfigFileError",
    "ConfigFormatError",
    "ConfigLimitError",
    "FileLock",
    "FileLockedError",
    "fsync_dir",
    "load_json_with_fallback",
    "parse_config_json",
    "write_json_atomically",
]
