"""The errors a commitlog tail raises; every one says at which offset it happened."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: tide.tail itself loads no gRPC (engines use it)
    import grpc

    from tide.tail._batch import RecordAt, RecordBatch


class TailError(Exception):
    """Base class: following a commitlog failed at ``offset``.

    ``records_before``: the valid records the failing chunk completed before the error
    (the assembler's ``next_offset`` is already past them; a follower delivers them
    before raising); ``batch_before``: the same records as a batch (None when the error
    did not come from an assembler).
    """

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(message)
        self.offset = offset
        self.records_before: tuple[RecordAt, ...] = ()
        self.batch_before: RecordBatch | None = None


class TailProtocolError(TailError):
    """The stream broke the Tail contract: a chunk at an unexpected offset, unwritten
    (zero) bytes where a record should start, a bad blank marker."""


class TailCorruptionError(TailError):
    """The bytes at ``offset`` are not a valid record (bad magic, size, CRC, or a
    physical_offset field that does not name its own position)."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(offset, f"invalid record at commitlog offset {offset}: {reason}")
        self.reason = reason


class TailOutOfRangeError(TailError):
    """The server answered OUT_OF_RANGE: ``offset`` is below the commitlog's min offset
    (deleted by retention) or past its max offset (e.g. recovery truncated a torn tail
    below it). Not retried: the caller must reconcile its position."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(offset, f"Tail from offset {offset} is out of range: {message}")
        self.server_message = message


class TailRpcError(TailError):
    """The server failed the Tail call with a status that retrying will not fix."""

    def __init__(self, offset: int, code: grpc.StatusCode, details: str) -> None:
        super().__init__(offset, f"Tail from offset {offset} failed with {code.name}: {details}")
        self.code = code
        self.details = details


class TailUnavailableError(TailError):
    """``max_consecutive_failures`` connection attempts in a row failed."""

    def __init__(self, offset: int, failures: int, reason: str) -> None:
        super().__init__(
            offset,
            f"gave up following from offset {offset} after {failures} consecutive "
            f"failures; the last: {reason}",
        )
        self.failures = failures
        self.reason = reason
