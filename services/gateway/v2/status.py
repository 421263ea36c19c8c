"""RocketMQ 5's answer codes: the v2 API answers every problem in-band, as a ``Status``
in the response (as the proxy does), never as a gRPC error the clients do not read.

``status_of`` maps the ``ServiceError`` of the shared operations onto the proxy's codes;
the v2 handlers check what has a code of its own (topic and group names, body size,
invisible and polling time) before calling them, so the mapping here is by gRPC code.
"""

from __future__ import annotations

import logging
from typing import TypeAlias

import grpc

from services.gateway.pop_errors import PopError
from tide.naming import consumer_group_error, topic_error
from tide.quoting import quote
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb

log = logging.getLogger("tide.gateway.v2")

Code: TypeAlias = v2.Code.ValueType

OK = v2.Status(code=v2.OK, message="OK")
SYSTEM_GROUP_PREFIX = "CID_RMQ_SYS_"  # RocketMQ's own groups: the proxy refuses them

# The proxy's code for each gRPC status of a shared operation (NOT_FOUND: the caller's,
# as what was not found depends on the call: a topic, a message, an offset).
_BY_GRPC: dict[grpc.StatusCode, Code] = {
    grpc.StatusCode.INVALID_ARGUMENT: v2.BAD_REQUEST,
    grpc.StatusCode.OUT_OF_RANGE: v2.BAD_REQUEST,
    grpc.StatusCode.ALREADY_EXISTS: v2.BAD_REQUEST,
    grpc.StatusCode.FAILED_PRECONDITION: v2.PRECONDITION_FAILED,
    # The gateway's budgets (in-flight bytes, held polls): the clients back off and retry.
    grpc.StatusCode.RESOURCE_EXHAUSTED: v2.TOO_MANY_REQUESTS,
    grpc.StatusCode.PERMISSION_DENIED: v2.FORBIDDEN,
    grpc.StatusCode.UNAUTHENTICATED: v2.UNAUTHORIZED,
    grpc.StatusCode.DEADLINE_EXCEEDED: v2.PROXY_TIMEOUT,
    grpc.StatusCode.UNAVAILABLE: v2.INTERNAL_SERVER_ERROR,
    grpc.StatusCode.UNIMPLEMENTED: v2.NOT_IMPLEMENTED,
}
_BY_POP_REASON: dict[pb.PopErrorReason.ValueType, Code] = {
    pb.POP_ERROR_INVALID_RECEIPT_HANDLE: v2.INVALID_RECEIPT_HANDLE,
    pb.POP_ERROR_RECEIPT_HANDLE_EXPIRED: v2.INVALID_RECEIPT_HANDLE,
    pb.POP_ERROR_UNAVAILABLE: v2.INTERNAL_SERVER_ERROR,
}


class V2Error(Exception):
    """A refusal with RocketMQ's own code, raised by the v2 handlers' checks."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def status(code: Code, message: str) -> v2.Status:
    return v2.Status(code=code, message=message)


def status_of(exc: Exception, not_found: Code = v2.NOT_FOUND) -> v2.Status:
    """The answer to a failed call; ``not_found``: the code of NOT_FOUND for this call."""
    if isinstance(exc, V2Error):
        return status(exc.code, exc.message)
    if isinstance(exc, PopError):
        return status(_BY_POP_REASON.get(exc.reason, v2.BAD_REQUEST), exc.message)
    if isinstance(exc, ServiceError):
        if exc.code is grpc.StatusCode.NOT_FOUND:
            return status(not_found, exc.message)
        return status(_BY_GRPC.get(exc.code, v2.INTERNAL_ERROR), exc.message)
    # A bug: logged with its traceback; the client gets an answer, never a hang.
    log.exception("v2 call failed")
    return status(v2.INTERNAL_ERROR, f"internal error: {quote(type(exc).__name__)}")


def name_of(resource: v2.Resource, field: str, code: Code) -> str:
    """A topic's or group's name; ``code`` (ILLEGAL_TOPIC, ...) when it is missing."""
    if not resource.name:
        raise V2Error(code, f"{field}.name is empty: give the {field}'s name")
    return resource.name


def topic_of(resource: v2.Resource, field: str = "topic") -> str:
    """A topic name by Tide's rules (tide.naming), else ILLEGAL_TOPIC."""
    topic = name_of(resource, field, v2.ILLEGAL_TOPIC)
    error = topic_error(topic)
    if error is not None:
        raise V2Error(v2.ILLEGAL_TOPIC, f"{field}: {error}")
    return topic


def group_of(resource: v2.Resource, field: str = "group") -> str:
    """A consumer group name by Tide's rules, not one of RocketMQ's system groups, else
    ILLEGAL_CONSUMER_GROUP."""
    group = name_of(resource, field, v2.ILLEGAL_CONSUMER_GROUP)
    error = consumer_group_error(group)
    if error is None and group.startswith(SYSTEM_GROUP_PREFIX):
        error = f"{quote(group)} starts with {SYSTEM_GROUP_PREFIX}, kept for system groups"
    if error is not None:
        raise V2Error(v2.ILLEGAL_CONSUMER_GROUP, f"{field}: {error}")
    return group
