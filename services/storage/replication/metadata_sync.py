"""A slave's metadata sync (RocketMQ's SlaveSynchronize): every
``--metadata-sync-interval-ms`` it asks its master for the metadata files (GetMetadata)
and installs each one whose content changed (engine/metadata_files.py: checked whole,
written atomically, the in-memory table reloaded; the topic table's listeners re-register
the broker with the name servers).

A file the master does not have is left as the slave has it: the master leaves out a
file it never wrote (a master on a new disk, a feature it never used), and deleting the
slave's copy then would throw away the only one. A failed sync (master unreachable, a
file this slave cannot load, a full disk) is logged once per outage with the reason,
keeps every file as it was, and is retried at the next interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc

from services.storage.engine.metadata_files import METADATA_FILES, MetadataFiles
from tide.limits import METADATA_MAX_BYTES
from tide.quoting import quote
from tide.server import cluster_channel_interceptors
from tide.tasks import cancel_and_wait
from tide.v1 import storage_pb2 as pb
from tide.v1 import storage_pb2_grpc as pb_grpc

log = logging.getLogger("tide.storage.replication.metadata")

CALL_TIMEOUT_S = 30.0  # one GetMetadata, up to METADATA_MAX_BYTES over the network
# The answer carries up to METADATA_MAX_BYTES of files plus their names and framing.
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", METADATA_MAX_BYTES + (1 << 20))]
_MAX_UNKNOWN_NAMES_LOGGED = 16
MAX_ERROR_CHARS = 2_000  # the reason kept for the status (every file's error, cut)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MetadataSync:
    """Runs on the service's event loop; file writes go to a worker thread."""

    def __init__(
        self,
        files: MetadataFiles,
        master_address: str,
        interval_ms: int,
        *,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self._files = files
        self._master = master_address
        self._interval_s = interval_ms / 1000
        self._clock_ms = clock_ms
        self._task: asyncio.Task[None] | None = None
        self._installing: asyncio.Future[list[str]] | None = None
        self.synced_at_ms = 0  # when the latest full sync ended (0: none yet)
        self.last_error = ""  # why the latest attempt failed ("" when it succeeded)
        self.syncs = 0  # attempts that got and installed every file (metrics)
        self.failures = 0  # attempts that failed
        self._failed_in_a_row = 0  # failed attempts in a row
        self._unknown_logged: set[str] = set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="storage.replication.metadata")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        await cancel_and_wait(task)
        installing = self._installing
        if installing is not None and not installing.done():
            with contextlib.suppress(Exception):  # (its errors were the sync's to report)
                await installing

    async def _run(self) -> None:
        async with grpc.aio.insecure_channel(
            self._master,
            options=CHANNEL_OPTIONS,
            interceptors=cluster_channel_interceptors() or None,
        ) as channel:
            stub: pb_grpc.StorageAsyncStub = pb_grpc.StorageStub(channel)
            while True:
                try:
                    await self.sync_once(stub)
                except Exception as exc:  # a bug: said, counted, and the loop goes on
                    log.exception("metadata sync from master %s broke", self._master)
                    self._failed(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(self._interval_s)

    async def sync_once(self, stub: pb_grpc.StorageAsyncStub) -> None:
        """One attempt: get the master's files and install those that changed."""
        try:
            response = await stub.GetMetadata(pb.GetMetadataRequest(), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self._failed(
                f"GetMetadata from master {self._master}: {exc.code().name}: {exc.details()}"
            )
            return
        # Shielded: a stop waits for an install under way (stop()) rather than closing
        # the store under it.
        installing = asyncio.get_running_loop().run_in_executor(
            None, self._install, list(response.files)
        )
        self._installing = installing
        errors = await asyncio.shield(installing)
        if errors:
            self._failed("; ".join(errors))
        else:
            self._succeeded()

    def _install(self, files: list[pb.MetadataFile]) -> list[str]:
        """Install each known file (topics first: METADATA_FILES' order); what failed."""
        by_name = {file.name: file.content for file in files}  # a name twice: the last
        for name in by_name.keys() - set(METADATA_FILES):
            self._note_unknown(name)
        errors = []
        installed = []
        for name in METADATA_FILES:
            content = by_name.get(name)
            if content is None:
                continue  # the master never wrote it: keep the slave's copy (module doc)
            try:
                if self._files.install(name, content):
                    installed.append(name)
            except Exception as exc:  # a bad file, a full disk: the others go on
                errors.append(f"{name}: {exc}")
        if installed:
            log.debug("installed %s from master %s", ", ".join(installed), self._master)
        return errors

    def _note_unknown(self, name: str) -> None:
        """A file a newer master has that this slave does not know: ignored, said once."""
        if name in self._unknown_logged or len(self._unknown_logged) >= _MAX_UNKNOWN_NAMES_LOGGED:
            return
        self._unknown_logged.add(name)
        log.info(
            "master %s sent metadata file %s this slave does not know; ignored",
            self._master,
            quote(name),
        )

    def _failed(self, reason: str) -> None:
        self.failures += 1
        self._failed_in_a_row += 1
        if len(reason) > MAX_ERROR_CHARS:
            reason = f"{reason[:MAX_ERROR_CHARS]}... ({len(reason)} characters)"
        self.last_error = reason
        if self._failed_in_a_row == 1:  # once per outage; the status keeps the latest reason
            log.warning(
                "metadata sync from master %s failed (retried every %g s; the slave keeps its "
                "copies): %s",
                self._master,
                self._interval_s,
                reason,
            )

    def _succeeded(self) -> None:
        if self._failed_in_a_row:
            log.info(
                "metadata sync from master %s works again after %d failed attempt(s)",
                self._master,
                self._failed_in_a_row,
            )
        elif not self.syncs:
            log.info("metadata synced from master %s", self._master)
        self._failed_in_a_row = 0
        self.syncs += 1
        self.last_error = ""
        self.synced_at_ms = self._clock_ms()
