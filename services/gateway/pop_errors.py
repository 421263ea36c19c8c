"""The errors of POP consumption (issue 20) that both wire APIs must tell apart.

``tide.v1`` answers them as a gRPC status (or per Ack entry); the RocketMQ 5 API
(``apache.rocketmq.v2``) as its own codes (INVALID_RECEIPT_HANDLE, 40013). The reason
travels with the error so that neither API parses the other's messages.
"""

from __future__ import annotations

import grpc

from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb

# Which gRPC status a reason is on ``tide.v1`` (a unary call on one handle).
_CODES: dict[pb.PopErrorReason.ValueType, grpc.StatusCode] = {
    pb.POP_ERROR_INVALID_RECEIPT_HANDLE: grpc.StatusCode.INVALID_ARGUMENT,
    pb.POP_ERROR_RECEIPT_HANDLE_EXPIRED: grpc.StatusCode.FAILED_PRECONDITION,
    pb.POP_ERROR_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
}


class PopError(ServiceError):
    """A receipt handle refused, with the reason the v2 API maps to its own code."""

    def __init__(self, reason: pb.PopErrorReason.ValueType, message: str) -> None:
        super().__init__(_CODES[reason], message)
        self.reason = reason
