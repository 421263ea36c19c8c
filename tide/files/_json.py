"""Crash-safe JSON config files (``config/*.json``), RocketMQ's ``<name>.tmp`` / ``.bak`` scheme.

Writing (:func:`write_json_atomically`):

1. write ``<name>.tmp`` and fsync it;
2. hard-link (or, where links are unsupported, copy + fsync) the current ``<name>`` to
   ``<name>.bak.tmp`` and rename that over ``<name>.bak``;
3. rename ``<name>.tmp`` over ``<name>``;
4. fsync the directory.

``<name>`` is only ever replaced by an atomic rename, so at every instant it holds a
complete version (the old or the new one) and ``<name>.bak`` holds a complete older
one. A main file that is not known to be good (it failed to parse, or was changed
behind our back and no longer parses) is never rotated into ``.bak``: the backup keeps
the last good version instead.

Callers serialise writes to one path (each table holds its own lock while writing).

Loading (:func:`load_json_with_fallback`) falls back to ``<name>.bak`` when the main
file is missing or unparsable, and raises :class:`ConfigFileError` when neither copy
can be read: it never starts empty over a corrupt config. Files written by RocketMQ's
fastjson (bare numeric map keys such as ``{0:12}``) are accepted too.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any, Literal

from tide.files._fsync import fsync_dir

_log = logging.getLogger("tide.storage.config")

MAX_CONFIG_FILE_BYTES = 1 << 30
"""Largest config file read or written (1 GiB)."""

ConfigSource = Literal["main", "bak", "none"]

# Errors from os.link that mean "this file system has no hard links": copy instead.
_NO_LINK_ERRNOS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK})
_MAX_KNOWN_GOOD_PATHS = 1024
# A JSON string, or a bare integer used as an object key (fastjson's Map<Integer, _>).
_STRING_OR_BARE_KEY = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")|([{,]\s*)(-?\d+)(\s*:)')

_MISSING = "is missing"
_FileIdentity = tuple[int, int, int, int]
_known_good: dict[Path, _FileIdentity] = {}
_known_good_lock = threading.Lock()


class ConfigFileError(Exception):
    """A config file and its backup both exist but neither can be read."""


class ConfigFormatError(ValueError):
    """A config file parsed as JSON but does not have the expected shape or values."""


class ConfigLimitError(Exception):
    """A config table is full; the gRPC layer maps this to RESOURCE_EXHAUSTED."""


def write_json_atomically(path: Path, obj: object) -> None:
    """Replace ``path`` with ``obj`` as JSON, keeping the previous version as ``.bak``."""
    write_json_bytes_atomically(path, json.dumps(obj, indent=2, allow_nan=False).encode("utf-8"))


def write_json_bytes_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, a JSON document already encoded (a copy of another
    store's file, byte for byte), keeping the previous version as ``.bak``. The caller
    has checked that ``data`` is the document it expects."""
    _replace(path, data, backup=True)


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (any bytes: a binary checkpoint) by the same
    write-temporary, rename, fsync-directory steps, without a ``.bak``: at every instant
    ``path`` holds the old or the new content, never a part of one."""
    _replace(path, data, backup=False)


def _replace(path: Path, data: bytes, *, backup: bool) -> None:
    if len(data) > MAX_CONFIG_FILE_BYTES:
        raise ConfigLimitError(
            f"{path} would be {len(data)} bytes; the limit is {MAX_CONFIG_FILE_BYTES} bytes"
        )
    tmp = _sibling(path, ".tmp")
    try:
        _write_synced(tmp, data)
        if backup:
            _keep_backup(path)
        os.replace(tmp, path)
    except OSError as exc:
        # A full disk (ENOSPC) fails the write of the temporary file: leave no partial
        # copy behind to hold space; ``path`` and its backup are untouched.
        tmp.unlink(missing_ok=True)
        if exc.filename is None:  # (a buffered write's error names no file)
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    if backup:
        _remember_good(path)


def load_json_with_fallback(
    path: Path, max_bytes: int = MAX_CONFIG_FILE_BYTES
) -> tuple[Any, ConfigSource]:
    """Load ``path``, or its ``.bak`` when it is missing or unparsable.

    Returns ``(obj, "main" | "bak")``, or ``(None, "none")`` when neither file exists;
    ``obj`` is whatever the JSON holds (``Any``, as from :func:`json.loads`).
    Raises :class:`ConfigFileError` when a file exists but no copy can be parsed, and
    lets I/O errors other than "not found" through (no fallback over a permission
    problem or a bad disk).
    """
    obj, main_problem = _try_load(path, max_bytes)
    if main_problem is None:
        _remember_good(path)
        return obj, "main"
    bak = _sibling(path, ".bak")
    obj, bak_problem = _try_load(bak, max_bytes)
    if bak_problem is None:
        _log.warning("config file %s %s; loaded the backup %s instead", path, main_problem, bak)
        return obj, "bak"
    if main_problem == bak_problem == _MISSING:
        return None, "none"
    raise ConfigFileError(
        f"cannot load config {path}: it {main_problem}, and the backup {bak} {bak_problem}; "
        "refusing to start with an empty table over a damaged config (repair or remove "
        "the files by hand)"
    )


def parse_config_json(text: str) -> object:
    """Parse JSON; on failure retry with fastjson's bare numeric keys quoted."""
    try:
        return _strict_loads(text)
    except json.JSONDecodeError as strict_error:
        quoted = _STRING_OR_BARE_KEY.sub(_quote_bare_key, text)
        if quoted == text:
            raise
        try:
            return _strict_loads(quoted)
        except json.JSONDecodeError:
            raise strict_error from None


def parse_config_bytes(name: str, content: bytes) -> object:
    """The JSON of a config file's bytes (another store's copy, say), or ConfigFormatError
    naming the file ``name`` when they are not UTF-8 JSON."""
    try:
        return parse_config_json(content.decode("utf-8"))
    except ValueError as exc:  # JSON and UTF-8 errors alike
        raise ConfigFormatError(f"{name} is not valid JSON: {exc}") from None


def _try_load(path: Path, max_bytes: int) -> tuple[object | None, str | None]:
    """(obj, None) when loaded, else (None, what is wrong)."""
    try:
        with open(path, "rb") as file:
            data = file.read(max_bytes + 1)
    except FileNotFoundError:
        return None, _MISSING
    if len(data) > max_bytes:
        return None, f"is larger than the limit of {max_bytes} bytes"
    try:
        return parse_config_json(data.decode("utf-8")), None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        return None, f"is not valid JSON ({exc})"


def _strict_loads(text: str) -> object:
    return json.loads(text, parse_constant=_reject_constant)


def _reject_constant(name: str) -> object:
    raise json.JSONDecodeError(f"{name} is not allowed in config files", name, 0)


def _quote_bare_key(match: re.Match[str]) -> str:
    if match.group(1) is not None:
        return match.group(1)
    return f'{match.group(2)}"{match.group(3)}"{match.group(4)}'


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def _keep_backup(path: Path) -> None:
    """Make ``<path>.bak`` the current ``path``, if ``path`` exists and is good."""
    try:
        identity = _identity(path)
    except FileNotFoundError:
        return
    bak = _sibling(path, ".bak")
    if not _is_known_good(path, identity) and not _parses(path):
        _log.warning("config file %s is unreadable; keeping %s as the backup", path, bak)
        return
    bak_tmp = _sibling(path, ".bak.tmp")
    bak_tmp.unlink(missing_ok=True)
    try:
        _link_or_copy(path, bak_tmp)
        os.replace(bak_tmp, bak)
    except BaseException:
        bak_tmp.unlink(missing_ok=True)  # a copy cut short by a full disk
        raise


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError as exc:
        if exc.errno not in _NO_LINK_ERRNOS:
            raise
        _log.info("no hard links for %s (%s); copying it to %s", src, exc, dst)
        shutil.copyfile(src, dst)
        fd = os.open(dst, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _parses(path: Path) -> bool:
    _obj, problem = _try_load(path, MAX_CONFIG_FILE_BYTES)
    return problem is None


def _identity(path: Path) -> _FileIdentity:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _remember_good(path: Path) -> None:
    """Record that ``path`` as it is now parses (we wrote or loaded it)."""
    identity = _identity(path)
    with _known_good_lock:
        if len(_known_good) >= _MAX_KNOWN_GOOD_PATHS and path not in _known_good:
            _known_good.clear()  # only a cache: forgetting costs one extra parse
        _known_good[path] = identity


def _is_known_good(path: Path, identity: _FileIdentity) -> bool:
    with _known_good_lock:
        return _known_good.get(path) == identity
