"""The transaction id the RocketMQ 5 API (``apache.rocketmq.v2``) hands a producer for a
half message (docs/formats.md, "RocketMQ 5 transaction ids").

A v2 client ends a transaction with only the message id and this id, while ending one
needs where the half is: its broker, queue offset and offset message id. So the id
carries them, with the half's own TRANSACTION_ID last:
``<broker_name>.<queue_offset>.<msg_id>.<transaction_id>``. Broker names hold no ``.``
(tide.naming), the offset is decimal and the msg_id hex, so the first three dots split
it whatever the transaction id holds. Clients treat it as opaque.
"""

from __future__ import annotations

from dataclasses import dataclass

from tide.quoting import quote

V2_TRANSACTION_ID_SEPARATOR = "."


class V2TransactionIdError(ValueError):
    """Not a transaction id the gateway gave out."""


@dataclass(frozen=True, slots=True)
class HalfLocation:
    broker_name: str
    queue_offset: int
    msg_id: str
    transaction_id: str


def encode_v2_transaction_id(half: HalfLocation) -> str:
    return V2_TRANSACTION_ID_SEPARATOR.join(
        (half.broker_name, str(half.queue_offset), half.msg_id, half.transaction_id)
    )


def parse_v2_transaction_id(text: str) -> HalfLocation:
    parts = text.split(V2_TRANSACTION_ID_SEPARATOR, 3)
    if len(parts) != 4 or not all(parts) or not parts[1].isdigit():
        raise V2TransactionIdError(
            f"transaction id {quote(text)} is not one this cluster gave out "
            "(<broker>.<queue offset>.<msg id>.<transaction id>): give the one SendMessage "
            "or the orphaned transaction check returned"
        )
    broker_name, offset, msg_id, transaction_id = parts
    return HalfLocation(broker_name, int(offset), msg_id, transaction_id)
