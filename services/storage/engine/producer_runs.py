"""Idempotent batches of several producers in one append (``AppendRequest.producer_runs``).

The gateway coalesces idempotent producers' batches into one Append as it does plain
ones (fewer, larger appends). Each entry of the request's ``records`` is one producer's
batch of one queue, with its producer fields in the matching ``producer_runs`` entry.
Every batch is checked as a single one is (one queue, ``__PID`` / ``__PSEQ`` on its first
and last records, the window under the lock), all before anything is written. A retry
among them is not answered here: the response has one store time and one ``duplicate``
flag for the whole call, so when any batch is a retry (or fails its check) nothing is
written and the gateway sends the batches alone (CoalescedRetryError, ABORTED), where
each gets its own answer.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from services.storage.engine.commitlog import AppendBatch
from services.storage.engine.errors import InvalidMessageError, StoreError
from services.storage.engine.producer_state import (
    ProducerStateTable,
    QueueKey,
    check_producer_properties,
    check_single_queue,
)
from services.storage.engine.record_run import RecordRun
from tide.format import BatchEntry


class CoalescedRetryError(StoreError):
    """A batch of a coalesced idempotent append is a retry: send the batches alone."""


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """One producer's batch in a coalesced append: its fields, then (once split) where
    its records are in the run and its queue."""

    producer_id: str
    epoch: int
    first_seq: int


@dataclass(frozen=True, slots=True)
class _Placed:
    fields: ProducerBatch
    key: QueueKey
    start: int  # its first record's index in the run
    end: int  # past its last record

    @property
    def last_seq(self) -> int:
        return self.fields.first_seq + self.end - self.start - 1


def place_batches(
    run: RecordRun, chunk_sizes: Sequence[int], batches: Sequence[ProducerBatch]
) -> list[_Placed]:
    """Each batch's records (the run's records split where the request's ``records``
    entries end) checked as a single batch is; InvalidMessageError otherwise."""
    if len(chunk_sizes) != len(batches):
        raise InvalidMessageError(
            f"{len(batches)} producer_runs for {len(chunk_sizes)} records entries: "
            "send one producer_runs entry per records entry"
        )
    placed: list[_Placed] = []
    seen: set[tuple[str, QueueKey]] = set()
    sizes = run.sizes
    ends = list(accumulate(sizes))  # where each record ends in the run
    start = start_pos = 0
    for chunk_bytes, fields in zip(chunk_sizes, batches, strict=True):
        end_pos = start_pos + chunk_bytes
        index = bisect_left(ends, end_pos, start) + 1  # past the record ending there
        if index > len(ends) or ends[index - 1] != end_pos or index == start:
            raise InvalidMessageError(
                f"records entry {len(placed)} does not hold whole records: "
                "a producer run is one or more whole records"
            )
        key = check_single_queue(run.queue_keys[start:index])
        last_seq = fields.first_seq + index - start - 1
        check_producer_properties(
            run.data,
            start_pos,
            sizes[start:index],
            fields.producer_id,
            fields.epoch,
            fields.first_seq,
            last_seq,
        )
        if (fields.producer_id, key) in seen:
            # Their order would matter, and the window is checked against the table:
            # alone, each is checked after the other was recorded.
            raise CoalescedRetryError(
                f"two batches of producer {fields.producer_id} for one queue in one "
                "append: send them alone, in order"
            )
        seen.add((fields.producer_id, key))
        placed.append(_Placed(fields, key, start, index))
        start, start_pos = index, end_pos
    return placed


def check_batches(table: ProducerStateTable, placed: Sequence[_Placed], now_ms: int) -> None:
    """Under the append lock: every batch is the next of its producer and queue (errors
    as for a single batch); CoalescedRetryError when one is a retry."""
    table.check_room_for([p.fields.producer_id for p in placed], now_ms)
    for p in placed:
        fields = p.fields
        earlier = table.check(fields.producer_id, p.key, fields.epoch, fields.first_seq, p.last_seq)
        if earlier is not None:
            raise CoalescedRetryError(
                f"producer {fields.producer_id} batch {fields.first_seq}-{p.last_seq} was "
                "stored before: send the batches alone for their own answers"
            )


def record_batches(
    table: ProducerStateTable, placed: Sequence[_Placed], batch: AppendBatch, now_ms: int
) -> None:
    """Under the append lock, after the append: each batch into the window."""
    for p in placed:
        fields = p.fields
        entry = BatchEntry(
            fields.first_seq,
            p.last_seq,
            batch.store_timestamp_ms,
            batch.physical_offsets[p.start : p.end],
            batch.queue_offsets[p.start : p.end],
            batch.sizes[p.start : p.end],
        )
        table.record(fields.producer_id, p.key, fields.epoch, entry, now_ms)
