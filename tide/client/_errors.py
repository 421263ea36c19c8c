"""The client's exceptions: one small hierarchy over the gateway's gRPC status codes."""

from __future__ import annotations

import grpc


class TideError(Exception):
    """A call to Tide failed. ``code`` is the gRPC status (None for client-side checks)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        if self.code is None:
            return self.message
        return f"{self.message} [{self.code.name}]"


class InvalidArgument(TideError):
    """A request field is malformed (checked by the client or the gateway)."""


class NotFound(TideError):
    """Something named in the request does not exist (broker, queue, message id)."""


class TopicNotFound(NotFound):
    """The topic does not exist (and the gateway does not create topics on demand)."""


class ResourceExhausted(TideError):
    """A broker's disk is full, a request is over a size limit, or too many sends are in
    flight in this client."""


class FailedPrecondition(TideError):
    """The queue is not writable / readable, or the store refuses writes."""


class Unavailable(TideError):
    """No gateway, broker or name server reachable (after the client's retries)."""


class DeadlineExceeded(TideError):
    """The call did not finish within its timeout."""


class OutOfRange(TideError):
    """OUT_OF_RANGE. From an IdempotentProducer: the batch's sequences are neither the
    next ones of its queue nor those of a batch the broker kept (a gap, or older than its
    window); the message says which sequence the broker expects."""


class AlreadyExists(TideError):
    """ALREADY_EXISTS. From an IdempotentProducer: the batch was stored before, but is
    older than the broker's window, so its results are no longer known."""


class Unauthenticated(TideError):
    """The gateway (--auth-enabled) could not authenticate the call: no or a bad signature,
    an unknown or disabled user, a clock off by more than the skew (docs/security.md)."""


class PermissionDenied(TideError):
    """The user's ACL does not allow the call; the message names the action and resource."""


_BY_CODE: dict[grpc.StatusCode, type[TideError]] = {
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def error_from_status(code: grpc.StatusCode, details: str, what: str) -> TideError:
    """The exception for a failed call: ``what`` names the call ("Produce to 'T'").

    NOT_FOUND becomes :class:`TopicNotFound` when the gateway's message is about the topic
    (its message starts with the thing that is missing), else :class:`NotFound`.
    """
    cls = _BY_CODE.get(code, TideError)
    if cls is NotFound and _is_about_topic(details):
        cls = TopicNotFound
    text = f"{what} failed: {details}" if details else f"{what} failed"
    return cls(text, code)


def error_from_rpc(error: grpc.RpcError, what: str) -> TideError:
    """Wrap a ``grpc.RpcError`` (a finished call, sync or grpc.aio's) as a
    :class:`TideError`."""
    call = isinstance(error, grpc.Call | grpc.aio.AioRpcError)
    code = error.code() if call else grpc.StatusCode.UNKNOWN
    details = (error.details() if call else None) or str(error)
    return error_from_status(code, details, what)


def _is_about_topic(details: str) -> bool:
    """The gateway names what is missing first: "topic 'T' does not exist ...", versus
    "broker 'b' does not serve topic 'T'" or "queue_id 9 is out of range: topic ..."."""
    return details.lstrip().lower().startswith("topic ")
