"""The transaction service's bookkeeping of half messages (services/dispatch/transaction):
which are resolved, which are being checked and how often, which wait for a gateway."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from tide.format import PGROUP, TRANS_HALF_TOPIC, TRANSACTION_ID, DecodedRecord
from tide.quoting import quote
from tide.server import ServiceError
from tide.v1 import dispatch_pb2 as pb

HALVES_MAX = 100_000
"""Default of --transaction-halves-max: most unresolved halves held (about 150 bytes
each, with their check counts and due entries). The oldest are held, as they are checked
first; later ones stay in the half queue and are read again once older ones are
resolved or discarded."""
RESOLVED_MAX = 500_000
"""Most resolutions held above the check offset (about 100 bytes each): they accumulate
behind the oldest half still open. Past it an EndTransaction is refused
(RESOURCE_EXHAUSTED) until that half is resolved or discarded after its last check:
refusing keeps "never written twice" true with bounded memory, and the producer's half
stays pending (its check-back or a retry resolves it later), so nothing is lost."""


@dataclass(frozen=True, slots=True)
class TransactionOptions:
    check_interval_ms: int = 60_000
    check_max: int = 15
    keep_after_max: bool = False
    halves_max: int = HALVES_MAX


@dataclass(slots=True)
class HalfInfo:
    """An unresolved half seen in the half queue."""

    physical_offset: int
    size: int
    group: str
    store_ms: int
    due_from_ms: int  # stored time, then the last check's time


@dataclass(slots=True)
class TransactionState:
    resolved: dict[int, str] = field(default_factory=dict)  # half queue offset -> how
    halves: dict[int, HalfInfo] = field(default_factory=dict)  # unresolved, seen
    checks: dict[int, int] = field(default_factory=dict)  # saved
    kept: set[int] = field(default_factory=set)  # past the maximum, kept: no more checks
    due: dict[str, set[int]] = field(default_factory=dict)  # halves to check, by group
    op_next: int = 0  # next op queue offset to read
    half_next: int = 0  # next half queue offset not yet seen
    check_from: int = 0  # every half below is resolved (or kept)
    halves_max: int = HALVES_MAX
    resolved_max: int = RESOLVED_MAX

    def halves_full(self) -> bool:
        return len(self.halves) >= self.halves_max

    def check_room(self, offset: int, *, pending: int = 0) -> None:
        """RESOURCE_EXHAUSTED when resolving the half at ``offset`` (after ``pending``
        others of its batch) would hold one resolution more than ``resolved_max`` (see
        RESOLVED_MAX)."""
        # The oldest open half itself (check_from) is always taken: resolving it frees.
        if offset <= self.check_from or len(self.resolved) + pending < self.resolved_max:
            return
        raise ServiceError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{len(self.resolved)} transactions resolved after the oldest open half message "
            f"(queue offset {self.check_from} of {TRANS_HALF_TOPIC}) are held, the bound "
            f"RESOLVED_MAX ({self.resolved_max}); retry once it is resolved or discarded "
            "after its last check (`tide transactions list` shows it); nothing was written",
        )

    def own_op_written(self, op_queue_offset: int) -> None:
        """The service writes every op record (under its lock): the one it just wrote
        need not be read back when it is the next to read."""
        if self.op_next == op_queue_offset:
            self.op_next += 1

    def resolution(self, offset: int) -> str | None:
        """`` (commit)`` etc. for a resolved half, ``""`` when only known resolved (below
        the check offset, where the resolutions are no longer kept), None when not."""
        how = self.resolved.get(offset)
        if how is not None:
            return f" ({how})"
        if offset in self.kept:  # past its last check, still open to an EndTransaction
            return None
        return "" if 0 <= offset < self.check_from else None

    def resolve(self, offset: int, how: str) -> bool:
        """Record a resolution; True when a saved check count went with it."""
        if offset >= self.check_from:  # below, every half is known resolved already
            self.resolved[offset] = how
        half = self.halves.pop(offset, None)
        self.kept.discard(offset)
        if half is not None:
            self.due.get(half.group, set()).discard(offset)
        counted = self.checks.pop(offset, None) is not None
        self.advance_check_from()
        return counted

    def keep(self, offset: int) -> None:
        self.kept.add(offset)
        self.advance_check_from()

    def advance_check_from(self) -> None:
        """Move past the halves resolved or kept (past their last check), forgetting the
        resolutions below: what is held stays bounded by the halves still being checked."""
        while self.check_from in self.resolved or self.check_from in self.kept:
            self.resolved.pop(self.check_from, None)
            self.check_from += 1

    def take_checks(self, group: str, max_count: int) -> list[int]:
        """The group's halves due for a check, oldest first (taken: each is sent once per
        check)."""
        due = self.due.get(group)
        if not due:
            return []
        taken = sorted(due)[:max_count]
        due.difference_update(taken)
        if not due:
            del self.due[group]  # the groups held stay those with halves due
        return taken


def unknown_half(offset: int) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.NOT_FOUND,
        f"no half message at queue offset {offset} of {TRANS_HALF_TOPIC} on this broker: give "
        "the half's ProduceResult (broker_name, queue_offset, msg_id) as it was returned",
    )


def check_half(
    request: pb.DispatchEndTransactionRequest, offset: int, record: DecodedRecord
) -> None:
    """INVALID_ARGUMENT when the request's producer group or transaction id is not the
    half's."""
    props = record.properties
    if props.get(PGROUP, "") != request.producer_group:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the half message at queue offset {offset} belongs to producer group "
            f"{quote(props.get(PGROUP, ''))}, not {quote(request.producer_group)}",
        )
    if props.get(TRANSACTION_ID, "") != request.transaction_id:
        raise ServiceError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"transaction id {quote(request.transaction_id)} does not match the half message "
            f"at queue offset {offset} (its transaction id is "
            f"{quote(props.get(TRANSACTION_ID, ''))})",
        )
