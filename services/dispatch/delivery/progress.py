"""Durable delivery progress: kept in the dispatch's store dir, copied to the storage.

``<store_dir>/config/delayOffset.json`` (tide.format's DelayOffsets, written atomically
with a ``.bak``) holds the next queue offset of each delay level. After each local save
the same bytes go to the storage with ``Storage.SaveDeliveryProgress``, so that a slave
receives them with the rest of the metadata (decision 2 of issue 18). A storage that does
not have that RPC (UNIMPLEMENTED) or does not answer (UNAVAILABLE, DEADLINE_EXCEEDED) is
logged once and the copy is tried again at the next save: the local file is the truth.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import grpc

from tide.files import load_json_with_fallback, write_json_atomically
from tide.format import (
    DELAY_OFFSET_FILE,
    DataVersion,
    DelayOffsets,
    decode_delay_offsets,
    encode_delay_offsets,
)

log = logging.getLogger("tide.dispatch.delivery")

CONFIG_DIR = "config"
SAVE_TIMEOUT_S = 5.0


class ProgressTarget(Protocol):
    target: str

    async def save_delivery_progress(
        self, delay_offsets_json: bytes = b"", timer_checkpoint: bytes = b""
    ) -> None: ...


def delay_offset_path(store_dir: Path) -> Path:
    return store_dir / CONFIG_DIR / DELAY_OFFSET_FILE


def load_delay_offsets(store_dir: Path) -> DelayOffsets:
    """The recorded progress (``.bak`` when the file is damaged), empty when none.
    Raises ConfigFileError / ConfigFormatError for a file that cannot be trusted: the
    dispatch refuses to start rather than deliver every level again from 0."""
    obj, _ = load_json_with_fallback(delay_offset_path(store_dir))
    return DelayOffsets() if obj is None else decode_delay_offsets(obj)


class DelayProgressFile:
    """Saves level offsets locally, then copies them to the storage.

    The local file is written after every delivered batch (a crash then repeats at most
    the batch in flight per level); the copy to the storage, which only slaves read, is
    sent at most once per save interval (``copy_pending``)."""

    def __init__(self, store_dir: Path, storage: ProgressTarget) -> None:
        self._path = delay_offset_path(store_dir)
        self._storage = storage
        self._version = DataVersion()
        self._copy_failed = False  # the last copy to the storage failed (logged once)
        self._pending_copy: bytes | None = None  # saved locally, not copied yet
        self._lock = asyncio.Lock()  # one writer of the file at a time (levels save alike)

    def resume_version(self, version: DataVersion) -> None:
        self._version = version

    async def save(self, offsets: Mapping[int, int], now_ms: int, *, copy: bool = True) -> None:
        """Write the file (off the event loop: it fsyncs), then copy it to the storage
        (now with ``copy``, else at the next :meth:`copy_pending`)."""
        async with self._lock:
            self._version = DataVersion(
                self._version.state_version, now_ms, self._version.counter + 1
            )
            document = encode_delay_offsets(DelayOffsets(dict(offsets), self._version))
            self._path.parent.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(write_json_atomically, self._path, document)
            self._pending_copy = json.dumps(document, indent=2).encode("utf-8")
        if copy:
            await self.copy_pending()

    async def copy_pending(self) -> None:
        """Copy the last local save to the storage, if it was not copied yet."""
        data, self._pending_copy = self._pending_copy, None
        if data is not None:
            await self._copy(data)

    async def _copy(self, data: bytes) -> None:
        try:
            await asyncio.wait_for(
                self._storage.save_delivery_progress(delay_offsets_json=data), SAVE_TIMEOUT_S
            )
        except (grpc.aio.AioRpcError, TimeoutError) as exc:
            if not self._copy_failed:
                reason = (
                    f"{exc.code().name}: {exc.details()}"
                    if isinstance(exc, grpc.aio.AioRpcError)
                    else "timed out"
                )
                log.warning(
                    "cannot copy the delay level progress to storage %s (%s); kept in %s, "
                    "copied again at the next save (slaves lack it meanwhile)",
                    self._storage.target,
                    reason,
                    self._path,
                )
            self._copy_failed = True
            return
        if self._copy_failed:
            log.info("delay level progress copied to storage %s again", self._storage.target)
        self._copy_failed = False
