"""EndTransactions of one broker resolved together (services/dispatch/transaction).

A resolution costs a storage Read of its half and an Append of its records; decided one
at a time (the lock that makes a half resolve once) a broker commits one transaction per
Read + Append round trip. Instead the service queues the EndTransactions that arrive
while a batch is being resolved and resolves them together as the next batch: one Read
of every half, one Append of every commit copy and op record (a run: the store writes
all of it or none, so a crash leaves each half either resolved with its copy or pending).

"Resolved once" stays exact: a batch takes a half at most once (a second EndTransaction
of it waits for the next batch, which finds it resolved, or still open when the first
failed), and a half resolved before the batch is refused as before.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import grpc

from services.dispatch.storage_client import AppendedRun
from services.dispatch.transaction.records import commit_copy, op_record
from services.dispatch.transaction.state import check_half
from tide.format import (
    REAL_QID,
    REAL_TOPIC,
    RESOLUTION_COMMIT,
    RESOLUTION_ROLLBACK,
    UNIQ_KEY,
    DecodedRecord,
    make_msg_id,
)
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as pb

log = logging.getLogger("tide.dispatch.transaction")

END_BATCH_MAX_COUNT = 256
"""Most EndTransactions resolved in one batch (within one storage Read's positions)."""
END_BATCH_MAX_BYTES = 32 * 1024 * 1024
"""Most half bytes one batch reads and copies (within one Read's bytes and one Append);
a larger half is still taken alone."""
END_PENDING_MAX = 10_000
"""Most EndTransactions waiting for a batch; past it: RESOURCE_EXHAUSTED (retry)."""


@dataclass(slots=True)
class Ending:
    """One EndTransaction waiting for its batch."""

    request: pb.DispatchEndTransactionRequest
    future: asyncio.Future[pb.DispatchEndTransactionResponse]

    @property
    def offset(self) -> int:
        return self.request.queue_offset

    def fail(self, error: BaseException) -> None:
        if not self.future.done():  # a caller that gave up (cancelled) is not answered
            self.future.set_exception(error)

    def answer(self, response: pb.DispatchEndTransactionResponse) -> None:
        if not self.future.done():
            self.future.set_result(response)


@dataclass(slots=True)
class Resolved:
    """An ending whose records are in the batch's run."""

    ending: Ending
    record: DecodedRecord  # the half
    resolution: str
    first_index: int  # its first record in the run (the commit copy, or the op record)
    op_index: int


@dataclass(slots=True)
class EndRun:
    """The run of a batch: every commit copy and op record, in the order of the endings."""

    parts: list[bytes] = field(default_factory=list)
    resolved: list[Resolved] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.parts)

    def add(self, ending: Ending, record: DecodedRecord, half_physical_offset: int) -> None:
        """Add the records of ``ending``; ServiceError (nothing added) when its request
        does not match the half or the half has no real destination."""
        request = ending.request
        check_half(request, ending.offset, record)
        resolution = RESOLUTION_COMMIT if request.commit else RESOLUTION_ROLLBACK
        records = []
        if request.commit:
            try:
                records.append(commit_copy(record, half_physical_offset))
            except ValueError as exc:  # REAL_TOPIC / REAL_QID missing or wrong
                raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION, str(exc)) from exc
        records.append(op_record(record, ending.offset, resolution))
        first = len(self.parts)
        self.parts.extend(records)
        self.resolved.append(Resolved(ending, record, resolution, first, len(self.parts) - 1))

    def data(self) -> bytes:
        return b"".join(self.parts)


def end_response(resolved: Resolved, appended: AppendedRun) -> pb.DispatchEndTransactionResponse:
    """The answer to a resolved EndTransaction: the committed copy's place (commit)."""
    if resolved.resolution != RESOLUTION_COMMIT:
        return pb.DispatchEndTransactionResponse()
    props = resolved.record.properties
    physical_offset = appended.physical_offsets[resolved.first_index]
    return pb.DispatchEndTransactionResponse(
        topic=props.get(REAL_TOPIC, ""),
        queue_id=int(props.get(REAL_QID, "0")),  # checked by commit_copy
        queue_offset=appended.queue_offsets[resolved.first_index],
        physical_offset=physical_offset,
        store_timestamp_ms=appended.store_timestamp_ms,
        unique_key=props.get(UNIQ_KEY, ""),
        msg_id=make_msg_id(appended.msg_id_prefix, physical_offset),
    )


def log_resolution(resolved: Resolved) -> None:
    request = resolved.ending.request
    log.log(
        logging.INFO if request.from_check else logging.DEBUG,
        "transaction %s of group %s: half at queue offset %d %s%s",
        quote(request.transaction_id),
        quote(request.producer_group),
        request.queue_offset,
        resolved.resolution,
        " (answer to a check)" if request.from_check else "",
    )
