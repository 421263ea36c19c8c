"""Durable delivery progress: kept in the dispatch's store dir, copied to the storage.

Each delivery service saves its progress locally (the truth), then copies the same bytes
to the storage with ``Storage.SaveDeliveryProgress`` so that a slave receives them with
the rest of the metadata (decision 2 of issue 18): :class:`ProgressCopy`, shared by the
delay levels and the timer. A storage that does not have that RPC (UNIMPLEMENTED) or does
not answer (UNAVAILABLE, DEADLINE_EXCEEDED) is logged once per outage and the copy is
tried again at the next save.

``<store_dir>/config/delayOffset.json`` (tide.format's DelayOffsets, written atomically
with a ``.bak``) holds the next queue offset of each delay level (:class:`DelayProgressFile`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import grpc

from services.dispatch.delivery.role import RoleWatcher
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
# Outcomes that mean "this storage cannot keep it now" (an older storage, a restart):
# expected, so logged at INFO; any other failure is a WARNING. Both once per outage.
_TOLERATED_CODES = frozenset({grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE})


class ProgressTarget(Protocol):
    target: str

    async def save_delivery_progress(
        self,
        delay_offsets_json: bytes = b"",
        timer_checkpoint: bytes = b"",
        transaction_checks_json: bytes = b"",
    ) -> None: ...


class ProgressCopy:
    """Copies one delivery service's progress to the storage, logging once per outage.

    Only while the storage is a master: a slave refuses it (it takes its copy from its
    master), and beside a slave nothing is delivered, so there is nothing new to copy."""

    def __init__(self, storage: ProgressTarget, role: RoleWatcher, what: str) -> None:
        self._storage = storage
        self._role = role
        self._what = what  # "delay level progress", "timer checkpoint": for the logs
        self._failing = False  # the last copy failed (logged once, until one passes)

    async def copy(
        self,
        *,
        delay_offsets_json: bytes = b"",
        timer_checkpoint: bytes = b"",
        transaction_checks_json: bytes = b"",
    ) -> bool:
        """Copy to the storage; False when it did not take it (logged, never raised: the
        local copy is what counts, the next save copies again)."""
        if not self._role.active:
            return False
        try:
            await self._storage.save_delivery_progress(
                delay_offsets_json=delay_offsets_json,
                timer_checkpoint=timer_checkpoint,
                transaction_checks_json=transaction_checks_json,
            )
        except grpc.aio.AioRpcError as exc:
            if not self._failing:
                log.log(
                    logging.INFO if exc.code() in _TOLERATED_CODES else logging.WARNING,
                    "cannot copy the %s to storage %s (%s: %s); kept locally, copied again "
                    "at the next save (slaves lack it meanwhile)",
                    self._what,
                    self._storage.target,
                    exc.code().name,
                    exc.details(),
                )
            self._failing = True
            return False
        if self._failing:
            log.info("%s copied to storage %s again", self._what, self._storage.target)
        self._failing = False
        return True


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

    def __init__(self, store_dir: Path, copier: ProgressCopy) -> None:
        self._path = delay_offset_path(store_dir)
        self._copier = copier
        self._version = DataVersion()
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
            await self._copier.copy(delay_offsets_json=data)
