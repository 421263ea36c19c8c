"""System topic names, retry/DLQ topics of a group, and the property names issue 18 adds."""

from __future__ import annotations

import pytest

from tide.format import (
    DLQ_TOPIC_PREFIX,
    RETRY_OR_DLQ_TOPIC_MAX_CHARS,
    RETRY_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    dlq_topic,
    encode_properties,
    group_of_dlq_topic,
    group_of_retry_topic,
    group_topic_error,
    is_dlq_topic,
    is_hidden_topic,
    is_retry_topic,
    is_system_topic,
    produce_topic_error,
    retry_topic,
)
from tide.format import _properties as props


def test_names_are_rocketmqs() -> None:
    """The exact spellings of MixAll, TopicValidator and TimerMessageStore."""
    assert (RETRY_TOPIC_PREFIX, DLQ_TOPIC_PREFIX) == ("%RETRY%", "%DLQ%")
    assert SCHEDULE_TOPIC == "SCHEDULE_TOPIC_XXXX"
    assert TIMER_TOPIC == "rmq_sys_wheel_timer"
    assert (TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC) == (
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    )


def test_property_names_are_rocketmqs() -> None:
    """MessageConst's values, one by one (a renamed constant would change stored bytes)."""
    expected = {
        "DELAY": "DELAY",
        "REAL_TOPIC": "REAL_TOPIC",
        "REAL_QID": "REAL_QID",
        "RETRY_TOPIC": "RETRY_TOPIC",
        "RECONSUME_TIME": "RECONSUME_TIME",
        "MAX_RECONSUME_TIMES": "MAX_RECONSUME_TIMES",
        "ORIGIN_MESSAGE_ID": "ORIGIN_MESSAGE_ID",
        "UNIQ_KEY": "UNIQ_KEY",
        "TIMER_DELIVER_MS": "TIMER_DELIVER_MS",
        "TIMER_DELAY_SEC": "TIMER_DELAY_SEC",
        "TIMER_DELAY_MS": "TIMER_DELAY_MS",
        "TIMER_OUT_MS": "TIMER_OUT_MS",
        "TIMER_ENQUEUE_MS": "TIMER_ENQUEUE_MS",
        "TIMER_DEQUEUE_MS": "TIMER_DEQUEUE_MS",
        "TIMER_ROLL_TIMES": "TIMER_ROLL_TIMES",
        "TIMER_DEL_UNIQKEY": "TIMER_DEL_UNIQKEY",
        "TIMER_DELAY_LEVEL": "TIMER_DELAY_LEVEL",
        "TRAN_MSG": "TRAN_MSG",
        "TRANSACTION_ID": "__transactionId__",
        "SHARDING_KEY": "__SHARDINGKEY",
        "PGROUP": "PGROUP",
        "DLQ_ORIGIN_TOPIC": "DLQ_ORIGIN_TOPIC",
        "DLQ_ORIGIN_MESSAGE_ID": "DLQ_ORIGIN_MESSAGE_ID",
        "CONSUME_START_TIME": "CONSUME_START_TIME",
    }
    assert {name: getattr(props, name) for name in expected} == expected


def test_schedule_properties_bytes() -> None:
    """A level-3 message for TopicTest queue 1, as stored in SCHEDULE_TOPIC_XXXX."""
    data = encode_properties({props.DELAY: "3", props.REAL_TOPIC: "TopicTest", props.REAL_QID: "1"})
    assert data == b"DELAY\x013\x02REAL_TOPIC\x01TopicTest\x02REAL_QID\x011\x02"


@pytest.mark.parametrize(
    ("topic", "system", "hidden"),
    [
        ("SCHEDULE_TOPIC_XXXX", True, True),
        ("rmq_sys_wheel_timer", True, True),
        ("rmq_sys_anything", True, True),
        ("RMQ_SYS_TRANS_HALF_TOPIC", True, True),
        ("RMQ_SYS_TRANS_OP_HALF_TOPIC", True, True),
        ("TBW102", True, True),
        ("%RETRY%g1", False, True),
        ("%DLQ%g1", False, True),
        ("TopicTest", False, False),
        ("BenchmarkTest", False, False),  # RocketMQ reserves it; Tide's users may use it
        ("SCHEDULE_TOPIC_XXXX_", False, False),
        ("x%RETRY%g1", False, False),
    ],
)
def test_system_and_hidden_topics(topic: str, system: bool, hidden: bool) -> None:
    assert is_system_topic(topic) is system
    assert is_hidden_topic(topic) is hidden


def test_retry_and_dlq_topics_round_trip() -> None:
    assert retry_topic("g1") == "%RETRY%g1"
    assert dlq_topic("g1") == "%DLQ%g1"
    assert group_of_retry_topic("%RETRY%g1") == "g1"
    assert group_of_dlq_topic("%DLQ%g1") == "g1"
    assert is_retry_topic("%RETRY%g1") and not is_retry_topic("%DLQ%g1")
    assert is_dlq_topic("%DLQ%g1") and not is_dlq_topic("%RETRY%g1")
    for other in ("TopicTest", "%RETRY%", "%DLQ%", "%DLQ%g1"):
        assert group_of_retry_topic(other) is None
    assert group_of_dlq_topic("%RETRY%g1") is None


def test_longest_group_with_a_retry_topic() -> None:
    """%RETRY%<group> may be 255 characters: 248 are left for the group."""
    longest = "g" * (RETRY_OR_DLQ_TOPIC_MAX_CHARS - len(RETRY_TOPIC_PREFIX))
    assert len(retry_topic(longest)) == RETRY_OR_DLQ_TOPIC_MAX_CHARS
    assert group_topic_error(longest) is None
    error = group_topic_error(longest + "g")
    assert error is not None and "248" in error and "255" in error
    assert len(error) < 400  # the name is quoted only up to a bound
    with pytest.raises(ValueError, match="limited to 248"):
        dlq_topic(longest + "g")
    with pytest.raises(ValueError, match="empty"):
        retry_topic("")


@pytest.mark.parametrize(
    ("topic", "says"),
    [
        ("SCHEDULE_TOPIC_XXXX", "delay_level"),
        ("rmq_sys_wheel_timer", "deliver_at_ms"),
        ("RMQ_SYS_TRANS_HALF_TOPIC", "transactional"),
        ("RMQ_SYS_TRANS_OP_HALF_TOPIC", "commit or roll back"),
        ("%RETRY%g1", "send-back"),
        ("%DLQ%g1", "tide dlq resend"),
        ("TBW102", "reserved"),
    ],
)
def test_produce_to_system_topic_refused(topic: str, says: str) -> None:
    error = produce_topic_error(topic)
    assert error is not None and says in error


def test_produce_to_ordinary_topic_allowed() -> None:
    assert produce_topic_error("TopicTest") is None
    assert produce_topic_error("BenchmarkTest") is None


def test_produce_error_quotes_a_long_name_bounded() -> None:
    error = produce_topic_error("%RETRY%" + "g" * 240)
    assert error is not None and "..." in error and len(error) < 200
