"""Errors the engine raises; the gRPC layer maps each kind to one status code."""

from __future__ import annotations


class StoreError(Exception):
    """Base class. ``str(error)`` says what happened and what to do."""


class InvalidMessageError(StoreError):
    """A message or request is malformed (INVALID_ARGUMENT)."""


class TopicNotFoundError(StoreError):
    """Unknown topic while auto-create is off (NOT_FOUND)."""


class DiskFullError(StoreError):
    """Disk usage above the refuse-writes threshold (RESOURCE_EXHAUSTED)."""


class NotWritableError(StoreError):
    """The store does not take writes now: closing, or a previous write failed
    (FAILED_PRECONDITION)."""


class StoreLockedError(StoreError):
    """Another process holds the store directory."""


class CorruptStoreError(StoreError):
    """The on-disk layout cannot be opened safely (a gap in the segment chain, bad sizes)."""


class SequenceError(StoreError):
    """An idempotent batch whose first sequence is neither the next one nor a stored
    batch's (a gap, or older than the window)."""


class AlreadyStoredError(StoreError):
    """An idempotent batch stored before, older than the window: its results are gone."""


class FencedProducerError(StoreError):
    """An idempotent batch of an epoch older than the producer's current one."""


class ProducerLimitError(StoreError):
    """max_idempotent_producers ids are remembered, none idle long enough to forget."""
