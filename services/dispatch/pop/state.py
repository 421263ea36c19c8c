"""What the POP service holds in memory while its storage is master (docs/pop.md).

Everything here is rebuilt on becoming master from the storage: the pop offsets from the
offset table, the checkpoints not yet resolved from the revive log after the revive
progress (RocketMQ's PopReviveService reads the same log)."""

from __future__ import annotations

from dataclasses import dataclass, field

import grpc

from tide.format import PopCheckpoint, revive_offset_of
from tide.server import ServiceError

QueueKey = tuple[str, str, int]  # (group, topic read, queue id)


@dataclass(frozen=True, slots=True)
class PopOptions:
    revive_interval_ms: int = 1_000
    checkpoints_max: int = 100_000
    offset_flush_interval_ms: int = 1_000


def key_of(ck: PopCheckpoint) -> QueueKey:
    return (ck.group, ck.topic, ck.queue_id)


@dataclass
class PopState:
    checkpoints_max: int
    # Checkpoints not yet resolved, by name: a revive queue offset, or a checkpoint run's
    # run_checkpoint_id (tide/format/_pop_checkpoint.py).
    held: dict[int, PopCheckpoint] = field(default_factory=dict)
    by_queue: dict[QueueKey, set[int]] = field(default_factory=dict)
    # The next queue offset a pop takes, per queue (the group's consumer offset).
    next: dict[QueueKey, int] = field(default_factory=dict)
    dirty: set[QueueKey] = field(default_factory=set)
    # FIFO queues moved back to an expired message: the offsets above it acked already
    # (skipped when taken again) and the attempts the moved-back ones had.
    fifo_acked: dict[QueueKey, set[int]] = field(default_factory=dict)
    fifo_attempts: dict[tuple[QueueKey, int], int] = field(default_factory=dict)
    # One past the last revive log record known (read at recovery, or written since).
    revive_end: int = 0

    def clear(self) -> None:
        self.held.clear()
        self.by_queue.clear()
        self.next.clear()
        self.dirty.clear()
        self.fifo_acked.clear()
        self.fifo_attempts.clear()
        self.revive_end = 0

    def check_room(self, count: int) -> None:
        if len(self.held) + count > self.checkpoints_max:
            raise ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{len(self.held)} received messages are not acked yet on this broker, the "
                f"limit (--pop-checkpoints-max {self.checkpoints_max}); ack them or wait "
                "for their invisible time to pass",
            )

    def add(self, offset: int, ck: PopCheckpoint) -> None:
        self.held[offset] = ck
        self.by_queue.setdefault(key_of(ck), set()).add(offset)
        self.revive_end = max(self.revive_end, revive_offset_of(offset) + 1)

    def resolve(self, offset: int) -> PopCheckpoint | None:
        ck = self.held.pop(offset, None)
        if ck is not None:
            offsets = self.by_queue.get(key_of(ck))
            if offsets is not None:
                offsets.discard(offset)
                if not offsets:
                    del self.by_queue[key_of(ck)]
        self.revive_end = max(self.revive_end, revive_offset_of(offset) + 1)
        return ck

    def advance(self, key: QueueKey, offset: int) -> None:
        if offset != self.next.get(key):
            self.next[key] = offset
            self.dirty.add(key)

    def inflight(self, key: QueueKey) -> int:
        return len(self.by_queue.get(key, ()))

    def revive_lag_ms(self, now_ms: int) -> int:
        """How long the oldest checkpoint past its invisible time has waited for its
        revive (0: none is due). O(checkpoints held): for a metrics sample only."""
        due = min((ck.invisible_until_ms for ck in self.held.values()), default=now_ms)
        return max(0, now_ms - due)

    def progress(self) -> int:
        """Where a recovery reads the revive log from: the oldest checkpoint held, else
        past everything known."""
        return min(map(revive_offset_of, self.held), default=self.revive_end)

    def fifo_expired(self, key: QueueKey) -> list[int]:
        """Move a FIFO queue back to its oldest checkpoint held: every checkpoint of the
        queue is resolved in memory (delivered again in place, attempt + 1); the revive
        offsets resolved are answered."""
        offsets = sorted(self.by_queue.get(key, ()))
        if not offsets:
            return []
        cks = [self.held[offset] for offset in offsets]
        back = min(ck.queue_offset for ck in cks)
        for offset, ck in zip(offsets, cks, strict=True):
            self.fifo_attempts[(key, ck.queue_offset)] = ck.attempt
            self.resolve(offset)
        if back < self.next.get(key, back):
            self.advance(key, back)
        return offsets
