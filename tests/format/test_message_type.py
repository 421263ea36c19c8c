"""A topic's message type (RocketMQ 5's message.type attribute) and a message's own."""

from __future__ import annotations

import pytest

from tide.format import (
    DELAY,
    SHARDING_KEY,
    TIMER_DELAY_SEC,
    TIMER_DELIVER_MS,
    TOPIC_MESSAGE_TYPE_ATTRIBUTE,
    TRAN_MSG,
    TopicMessageType,
    delay_conflict_error,
    message_type_error,
    message_type_of,
    topic_message_type,
)

T = TopicMessageType


def test_attribute_name_and_values_are_rocketmqs() -> None:
    assert TOPIC_MESSAGE_TYPE_ATTRIBUTE == "message.type"
    assert [t.value for t in T] == [
        "UNSPECIFIED", "NORMAL", "FIFO", "DELAY", "TRANSACTION", "MIXED",
    ]  # fmt: skip


def test_topic_type_from_attributes() -> None:
    assert topic_message_type({}) is T.NORMAL
    assert topic_message_type({"message.type": "DELAY"}) is T.DELAY
    with pytest.raises(ValueError, match="'delay'; it must be one of UNSPECIFIED, NORMAL"):
        topic_message_type({"message.type": "delay"})


@pytest.mark.parametrize(
    ("properties", "kind"),
    [
        ({}, T.NORMAL),
        ({DELAY: "3"}, T.DELAY),
        ({TIMER_DELIVER_MS: "1700000000000"}, T.DELAY),
        ({TIMER_DELAY_SEC: "10"}, T.DELAY),
        ({SHARDING_KEY: "k"}, T.FIFO),
        ({TRAN_MSG: "true", DELAY: "3"}, T.TRANSACTION),
        ({TRAN_MSG: "false"}, T.NORMAL),
        ({DELAY: "3", SHARDING_KEY: "k"}, T.DELAY),
    ],
)
def test_message_type_from_properties(properties: dict[str, str], kind: T) -> None:
    """TopicMessageType.parseFromMessageProperty's order."""
    assert message_type_of(properties) is kind


def test_type_check() -> None:
    assert message_type_error("t", T.DELAY, T.DELAY) is None
    assert message_type_error("t", T.MIXED, T.FIFO) is None
    error = message_type_error("t", T.NORMAL, T.DELAY)
    assert error == (
        "topic 't' takes NORMAL messages, and this message is DELAY; send it to a topic "
        "of that type (or MIXED)"
    )
    assert message_type_error("t", T.MIXED, T.UNSPECIFIED) is not None
    long_error = message_type_error("t" * 500, T.NORMAL, T.FIFO)
    assert long_error is not None and len(long_error) < 200


def test_delay_with_transaction_is_refused() -> None:
    error = delay_conflict_error({TRAN_MSG: "true", TIMER_DELIVER_MS: "1"})
    assert error is not None and "transactional message cannot be delayed" in error
    assert delay_conflict_error({TRAN_MSG: "true"}) is None
    assert delay_conflict_error({DELAY: "3"}) is None
