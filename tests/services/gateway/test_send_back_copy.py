"""What a sent-back message becomes (send_back_copy.py): the delay each policy picks and
the properties of the retry copy and of the dead letter, attempt after attempt."""

from __future__ import annotations

from services.gateway.send_back_copy import (
    ORIGIN_STORE_TIME,
    Delay,
    dead_letter_copy,
    retry_copy,
    retry_delay,
)
from tide.format import (
    DEFAULT_DELAY_LEVEL_TABLE,
    DELAY,
    DLQ_ORIGIN_MESSAGE_ID,
    DLQ_ORIGIN_TOPIC,
    ORIGIN_MESSAGE_ID,
    REAL_QID,
    REAL_TOPIC,
    RETRY_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_DELIVER_MS,
    TIMER_TOPIC,
    CustomizedRetryPolicy,
    ExponentialRetryPolicy,
    GroupRetryPolicy,
    RetryPolicyType,
    parse_delay_levels,
)
from tide.v1 import storage_pb2 as storage_pb

NOW_MS = 1_700_000_000_000


def stored(**fields: object) -> storage_pb.StoredMessage:
    message = storage_pb.StoredMessage(
        topic="Orders",
        queue_id=1,
        body=b"b",
        tags="TagA",
        keys=["k1", "k2"],
        properties={"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": "U1", "color": "red"},
        msg_id="ID0",
        store_timestamp_ms=NOW_MS - 5,
        born_host="10.0.0.1:5000",
        sys_flag=0b0011_0001,  # the host bits the store owns, and compression
    )
    for name, value in fields.items():
        if name == "properties":
            message.properties.clear()
            message.properties.update(value)  # type: ignore[call-overload]
        else:
            setattr(message, name, value)
    return message


def test_the_default_policy_is_rocketmq_4s_levels_clamped_to_the_table() -> None:
    policy = GroupRetryPolicy()
    table = DEFAULT_DELAY_LEVEL_TABLE
    assert retry_delay(policy, table, 0, 0, NOW_MS) == Delay(level=3)
    assert retry_delay(policy, table, 5, 0, NOW_MS) == Delay(level=8)
    assert retry_delay(policy, table, 40, 0, NOW_MS) == Delay(level=18)
    short = parse_delay_levels("1s 1s 1s 1s 1s")
    assert retry_delay(policy, short, 9, 0, NOW_MS) == Delay(level=5)
    # A requested level wins, clamped to the table as RocketMQ's putMessage clamps.
    assert retry_delay(policy, table, 0, 2, NOW_MS) == Delay(level=2)
    assert retry_delay(policy, short, 0, 7, NOW_MS) == Delay(level=5)


def test_a_custom_list_or_an_exponential_policy_picks_a_timer_time() -> None:
    table = DEFAULT_DELAY_LEVEL_TABLE
    custom = GroupRetryPolicy(customized=CustomizedRetryPolicy((100, 200, 300, 400)))
    assert retry_delay(custom, table, 0, 0, NOW_MS) == Delay(deliver_at_ms=NOW_MS + 300)
    assert retry_delay(custom, table, 9, 0, NOW_MS) == Delay(deliver_at_ms=NOW_MS + 400)
    exponential = GroupRetryPolicy(
        type=RetryPolicyType.EXPONENTIAL,
        exponential=ExponentialRetryPolicy(initial_ms=1_000, max_ms=5_000, multiplier=2),
    )
    assert [
        retry_delay(exponential, table, r, 0, NOW_MS).deliver_at_ms - NOW_MS for r in range(5)
    ] == [
        1_000,
        2_000,
        4_000,
        5_000,
        5_000,
    ]


def test_the_retry_copy_through_a_level_keeps_the_message_and_names_its_origin() -> None:
    copy = retry_copy(stored(), "%RETRY%G", 2, 16, Delay(level=3), NOW_MS, 1000)
    assert (copy.topic, copy.queue_id, copy.reconsume_times) == (SCHEDULE_TOPIC, 2, 1)
    assert (copy.body, copy.tags, list(copy.keys)) == (b"b", "TagA", ["k1", "k2"])
    assert copy.sys_flag == 0b0000_0001  # the store's host bit is its own to set
    assert copy.born_host == "10.0.0.1:5000"
    props = dict(copy.properties)
    assert "TAGS" not in props and "KEYS" not in props  # fields, written back by the store
    assert props["UNIQ_KEY"] == "U1" and props["color"] == "red"
    assert props[DELAY] == "3"
    assert (props[REAL_TOPIC], props[REAL_QID]) == ("%RETRY%G", "2")
    assert (props[RETRY_TOPIC], props[ORIGIN_MESSAGE_ID]) == ("Orders", "ID0")
    assert props[ORIGIN_STORE_TIME] == str(NOW_MS - 5)
    assert (props["RECONSUME_TIME"], props["MAX_RECONSUME_TIMES"]) == ("1", "16")


def test_a_later_attempt_keeps_the_first_attempts_origin_and_drops_old_bookkeeping() -> None:
    earlier = stored(
        topic="%RETRY%G",
        msg_id="ID1",
        reconsume_times=1,
        properties={
            "UNIQ_KEY": "U1",
            RETRY_TOPIC: "Orders",
            ORIGIN_MESSAGE_ID: "ID0",
            ORIGIN_STORE_TIME: "42",
            DELAY: "3",
            REAL_TOPIC: "%RETRY%G",
            REAL_QID: "0",
        },
    )
    copy = retry_copy(earlier, "%RETRY%G", 0, 16, Delay(deliver_at_ms=NOW_MS + 5_000), NOW_MS, 1000)
    assert (copy.topic, copy.queue_id, copy.reconsume_times) == (TIMER_TOPIC, 0, 2)
    props = dict(copy.properties)
    assert DELAY not in props
    assert props[TIMER_DELIVER_MS] == str(NOW_MS + 5_000)
    assert (props[RETRY_TOPIC], props[ORIGIN_MESSAGE_ID], props[ORIGIN_STORE_TIME]) == (
        "Orders",
        "ID0",
        "42",
    )


def test_the_dead_letter_names_the_original_topic_and_message() -> None:
    earlier = stored(
        topic="%RETRY%G",
        msg_id="ID3",
        reconsume_times=3,
        properties={"UNIQ_KEY": "U1", RETRY_TOPIC: "Orders", ORIGIN_MESSAGE_ID: "ID0"},
    )
    dead = dead_letter_copy(earlier, "%DLQ%G", 3)
    assert (dead.topic, dead.queue_id, dead.reconsume_times) == ("%DLQ%G", 0, 4)
    props = dict(dead.properties)
    assert (props[DLQ_ORIGIN_TOPIC], props[DLQ_ORIGIN_MESSAGE_ID]) == ("Orders", "ID0")
    assert REAL_TOPIC not in props and DELAY not in props
    # A first-attempt message dead-lettered at once names itself.
    at_once = dict(dead_letter_copy(stored(), "%DLQ%G", 16).properties)
    assert (at_once[DLQ_ORIGIN_TOPIC], at_once[DLQ_ORIGIN_MESSAGE_ID]) == ("Orders", "ID0")
