"""Message properties: ``name \\x01 value \\x02`` repeated, UTF-8 (RocketMQ's encoding)."""

from __future__ import annotations

from collections.abc import Mapping

from tide.quoting import quote

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"

# Well-known property names, spelled as RocketMQ's MessageConst (docs/formats.md,
# "Message properties"). Names are part of the stored bytes: never rename one.
KEYS = "KEYS"
TAGS = "TAGS"
UNIQ_KEY = "UNIQ_KEY"  # PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX: the client message id
WAIT = "WAIT"  # PROPERTY_WAIT_STORE_MSG_OK
DELAY = "DELAY"  # PROPERTY_DELAY_TIME_LEVEL: the delay level, "1".."18"
# Delay levels and the timer: where a message goes once due.
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"  # PROPERTY_REAL_QUEUE_ID
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"  # producer: absolute delivery time, ms since epoch
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"  # producer: relative delay in seconds
TIMER_DELAY_MS = "TIMER_DELAY_MS"  # producer: relative delay in ms
TIMER_OUT_MS = "TIMER_OUT_MS"  # broker: the slot time the timer files the message under
TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"  # a recall: the UNIQ_KEY of the timed message to cancel
TIMER_DELAY_LEVEL = "TIMER_DELAY_LEVEL"
# Retries and dead letters (consumer send-back).
RETRY_TOPIC = "RETRY_TOPIC"  # the original topic of a message in %RETRY%<group>
RECONSUME_TIME = "RECONSUME_TIME"
MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"  # the first attempt's message id
DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
CONSUME_START_TIME = "CONSUME_START_TIME"  # PROPERTY_CONSUME_START_TIMESTAMP
# Transactions and ordering.
TRAN_MSG = "TRAN_MSG"  # PROPERTY_TRANSACTION_PREPARED: "true" on a half message
TRANSACTION_ID = "__transactionId__"
PGROUP = "PGROUP"  # PROPERTY_PRODUCER_GROUP
SHARDING_KEY = "__SHARDINGKEY"


def property_error(name: str, value: str) -> str | None:
    """Why this property cannot be encoded, or None when it can."""
    for label, text in (("name", name), ("value", value)):
        if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
            return (
                f"the {label} of property {quote(name)} contains a reserved \\x01 or \\x02 "
                "character"
            )
    if not name:
        return "property name is empty"
    return None


def encode_properties(properties: Mapping[str, str]) -> bytes:
    """Encode in the mapping's order. Callers validate with :func:`property_error` first."""
    if not properties:
        return b""
    return "".join(
        f"{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
        for name, value in properties.items()
    ).encode("utf-8")


def decode_properties(data: bytes) -> dict[str, str]:
    """Decode; tolerant of a missing final separator, as RocketMQ's decoder is."""
    result: dict[str, str] = {}
    if not data:
        return result
    for item in data.decode("utf-8", errors="replace").split(PROPERTY_SEPARATOR):
        if not item:
            continue
        name, sep, value = item.partition(NAME_VALUE_SEPARATOR)
        if sep:
            result[name] = value
    return result
