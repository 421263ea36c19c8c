"""EndTransaction and the orphaned-transaction check-back of the v2 API, onto the
gateway's Transactions (tide.v1 EndTransaction and TransactionChecks).

A v2 producer's group is its topic (RocketMQ 5's proxy registers producers by topic):
its halves are stored with the topic as producer group, and the Telemetry stream of a
producer whose settings list the topic takes that group's checks (telemetry.py), each
sent as a RecoverOrphanedTransactionCommand whose transaction id locates the half
(tide.format encode_v2_transaction_id).
"""

from __future__ import annotations

from services.gateway.transactions import Transactions
from services.gateway.v2.messages import v2_message
from services.gateway.v2.status import OK, V2Error, status_of, topic_of
from tide.format import (
    HalfLocation,
    V2TransactionIdError,
    encode_v2_transaction_id,
    parse_v2_transaction_id,
)
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

_RESOLUTIONS = {v2.COMMIT: pb.COMMIT, v2.ROLLBACK: pb.ROLLBACK}


async def end_transaction(
    transactions: Transactions, request: v2s.EndTransactionRequest
) -> v2s.EndTransactionResponse:
    try:
        topic = topic_of(request.topic)
        resolution = _RESOLUTIONS.get(request.resolution)
        if resolution is None:
            raise V2Error(v2.BAD_REQUEST, "resolution must be COMMIT or ROLLBACK")
        try:
            half = parse_v2_transaction_id(request.transaction_id)
        except V2TransactionIdError as exc:
            raise V2Error(v2.INVALID_TRANSACTION_ID, str(exc)) from exc
        await transactions.end(
            pb.EndTransactionRequest(
                producer_group=topic,
                broker_name=half.broker_name,
                msg_id=half.msg_id,
                queue_offset=half.queue_offset,
                transaction_id=half.transaction_id,
                resolution=resolution,
                from_check=request.source == v2.SOURCE_SERVER_CHECK,
            )
        )
    except Exception as exc:
        return v2s.EndTransactionResponse(status=status_of(exc, v2.INVALID_TRANSACTION_ID))
    return v2s.EndTransactionResponse(status=OK)


def recover_command(half: pb.HalfMessage) -> v2s.TelemetryCommand:
    """A half due for a check as the command a v2 producer's checker answers (the
    message's body encoding must be IDENTITY or the client never calls its checker)."""
    stored = storage_pb.StoredMessage(
        topic=half.topic,
        queue_id=half.queue_id,
        body=half.body,
        properties=half.properties,
        store_timestamp_ms=half.store_timestamp_ms,
        msg_id=half.msg_id,
    )
    message = v2_message(stored)
    message.system_properties.message_type = v2.TRANSACTION
    transaction_id = encode_v2_transaction_id(
        HalfLocation(half.broker_name, half.queue_offset, half.msg_id, half.transaction_id)
    )
    return v2s.TelemetryCommand(
        recover_orphaned_transaction_command=v2s.RecoverOrphanedTransactionCommand(
            message=message, transaction_id=transaction_id
        )
    )
