"""Re-put: due messages of the schedule or timer topic appended to their real destination.

RocketMQ's ``ScheduleMessageService.messageTimeup`` / ``TimerMessageStore.convertMessage``
then ``putMessage``. Given the stored records of messages that are due (decoded by
``tide.format.decode_record``), :meth:`Reput.put` builds each real copy
(``tide.format.real_destination``: real topic and queue, bookkeeping properties removed,
``UNIQ_KEY`` and user properties kept; body, flag, born time and host, reconsume times
copied) and appends them to the followed storage as record runs, in bounded batches.

Guarantees (the callers' progress rests on them):

* :meth:`Reput.put` returns only once every copy was appended or found undeliverable, so
  a caller advances its progress after ``put`` returns, never before.
* A failure that may pass (the storage down or restarting, a slave, disk full, a timeout)
  is retried with backoff, forever, until it passes or the caller's task is cancelled
  (then nothing after the last appended batch counts as delivered: it is delivered again
  later, at-least-once).
* A failure that will not pass is not retried: a record without a real destination, and
  a copy the store refuses as INVALID_ARGUMENT (the whole batch is refused before any of
  it is written, so the batch is retried one copy at a time to find the bad one) or
  NOT_FOUND (its real topic was deleted). Each is logged and counted
  (``tide_dispatch_delivery_undeliverable_total``) and progress moves past it; holding
  it would hold every later message of its queue forever.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from services.dispatch.delivery.metrics import lateness_histogram, undeliverable_counter
from services.dispatch.storage_client import AppendedRun
from tide.format import (
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_PRODUCER_MASK,
    DecodedRecord,
    encode_properties,
    encode_record,
    pack_host,
    real_destination,
)
from tide.quoting import quote
from tide.tail import Backoff

log = logging.getLogger("tide.dispatch.delivery")

REPUT_MAX_BATCH_RECORDS = 256
"""Most copies in one Append (well under the storage's --max-batch-messages default)."""
REPUT_MAX_BATCH_BYTES = 4 * 1024 * 1024
"""Most bytes in one Append (a larger record still goes, alone)."""
# A run's record keeps the producer's sys_flag bits only (SYSFLAG_PRODUCER_MASK: the store
# refuses others); the born host bit is set again from the host's length.
_NO_STORE_HOST = bytes(8)  # the store writes its own
# Codes that will not change by retrying the same copy.
PERMANENT_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND})
# While the storage refuses: one warning, then a reminder this often.
RETRY_LOG_INTERVAL_S = 30.0


class AppendTarget(Protocol):
    """The storage a re-put appends to (services/dispatch/storage_client.StorageClient)."""

    target: str

    async def append_run(self, run: bytes, count: int) -> AppendedRun: ...


@dataclass(frozen=True, slots=True)
class DueMessage:
    """A stored record of the schedule or timer topic, and the time it was due (ms)."""

    record: DecodedRecord
    due_ms: int


@dataclass(frozen=True, slots=True)
class ReputResult:
    delivered: int
    undeliverable: int


@dataclass(frozen=True, slots=True)
class _Copy:
    data: bytes  # the real copy as a run record
    due_ms: int
    source: str  # "<topic> queue <id> offset <queue offset>", for logs


class Reput:
    """Appends the real copies of due messages; one per delivery service (``kind`` is the
    lateness histogram's attribute: ``delay_level`` or ``timer``)."""

    def __init__(
        self,
        storage: AppendTarget,
        kind: str,
        *,
        max_batch_records: int = REPUT_MAX_BATCH_RECORDS,
        max_batch_bytes: int = REPUT_MAX_BATCH_BYTES,
        backoff: Backoff | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        assert max_batch_records >= 1 and max_batch_bytes >= 1
        self._storage = storage
        self._kind = kind
        self._attributes = {"kind": kind}
        self._max_records = max_batch_records
        self._max_bytes = max_batch_bytes
        self._backoff = backoff if backoff is not None else Backoff(initial_s=0.1, max_s=5.0)
        self._clock_s = clock_s
        self.delivered_total = 0
        self.undeliverable_total = 0
        self.failed_attempts = 0  # Append calls that failed and were retried

    async def put(self, messages: Sequence[DueMessage]) -> ReputResult:
        """Append the real copy of each message, in order; see the module's guarantees."""
        delivered_before, undeliverable_before = self.delivered_total, self.undeliverable_total
        copies: list[_Copy] = []
        for message in messages:
            copy = self._real_copy(message)
            if copy is not None:
                copies.append(copy)
        for batch in self._batches(copies):
            await self._append(batch)
        return ReputResult(
            self.delivered_total - delivered_before,
            self.undeliverable_total - undeliverable_before,
        )

    def _real_copy(self, message: DueMessage) -> _Copy | None:
        record = message.record
        source = f"{quote(record.topic)} queue {record.queue_id} offset {record.queue_offset}"
        try:
            topic, queue_id, properties = real_destination(
                record.topic, record.queue_id, record.properties
            )
        except ValueError as exc:
            self.undeliverable(source, str(exc))
            return None
        born_host = pack_host(record.born_host)
        sys_flag = record.sys_flag & SYSFLAG_PRODUCER_MASK
        if len(born_host) != 8:
            sys_flag |= SYSFLAG_BORN_HOST_V6
        encoded = encode_record(
            topic,
            topic.encode("utf-8"),
            queue_id,
            record.body,
            encode_properties(properties),
            record.flag,
            sys_flag,
            record.born_timestamp_ms,
            born_host,
            _NO_STORE_HOST,
            record.reconsume_times,
            record.prepared_transaction_offset,
        )
        return _Copy(encoded.data, message.due_ms, source)

    def _batches(self, copies: Sequence[_Copy]) -> Iterator[Sequence[_Copy]]:
        start = size = 0
        for index, copy in enumerate(copies):
            full = index - start >= self._max_records or size + len(copy.data) > self._max_bytes
            if index > start and full:
                yield copies[start:index]
                start, size = index, 0
            size += len(copy.data)
        if start < len(copies):
            yield copies[start:]

    async def _append(self, batch: Sequence[_Copy]) -> None:
        """Append ``batch`` as one run, retrying what may pass (see the module doc)."""
        failures = 0
        first_failure_s = last_log_s = 0.0
        while True:
            try:
                appended = await self._storage.append_run(
                    b"".join(copy.data for copy in batch), len(batch)
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in PERMANENT_CODES:
                    await self._refused(batch, f"{exc.code().name}: {exc.details()}")
                    return
                reason = f"{exc.code().name}: {exc.details()}"
            except RuntimeError as exc:  # an answer that does not fit the request
                reason = str(exc)
            else:
                self._delivered(batch, appended)
                if failures:
                    log.info(
                        "%s re-put: storage %s took the batch after %d failed attempt(s)",
                        self._kind,
                        self._storage.target,
                        failures,
                    )
                return
            failures += 1
            self.failed_attempts += 1
            now_s = self._clock_s()
            if failures == 1:
                first_failure_s = last_log_s = now_s
                log.warning(
                    "%s re-put of %d message(s) to storage %s failed (%s); retrying until "
                    "it is taken",
                    self._kind,
                    len(batch),
                    self._storage.target,
                    reason,
                )
            elif now_s - last_log_s >= RETRY_LOG_INTERVAL_S:
                last_log_s = now_s
                log.warning(
                    "%s re-put still failing after %.0f s, %d attempts: %s",
                    self._kind,
                    now_s - first_failure_s,
                    failures,
                    reason,
                )
            await asyncio.sleep(self._backoff.delay_s(failures))

    async def _refused(self, batch: Sequence[_Copy], reason: str) -> None:
        if len(batch) == 1:
            self.undeliverable(batch[0].source, f"the storage refused its copy ({reason})")
            return
        # The store refuses a whole run for one bad record and writes none of it: find it.
        for copy in batch:
            await self._append((copy,))

    def _delivered(self, batch: Sequence[_Copy], appended: AppendedRun) -> None:
        self.delivered_total += len(batch)
        histogram = lateness_histogram()
        for copy in batch:
            lateness_ms = max(0, appended.store_timestamp_ms - copy.due_ms)
            histogram.record(lateness_ms, self._attributes)

    def undeliverable(self, source: str, why: str) -> None:
        """Count and log a due message that will never be delivered (progress moves on)."""
        self.undeliverable_total += 1
        undeliverable_counter().add(1, self._attributes)
        log.error("%s re-put: message of %s is undeliverable, skipped: %s", self._kind, source, why)
