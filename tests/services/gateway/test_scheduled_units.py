"""The gateway's delayed-produce rewrite against a broker's bounds, without processes (the
timer's side: the dispatches of these tests' clusters may run no timer)."""

from __future__ import annotations

import grpc

from services.gateway.scheduled import (
    DeliveryBounds,
    broker_delay_error,
    scheduled_record,
    static_delay_error,
)
from tide.format import DEFAULT_DELAY_LEVEL_TABLE, SCHEDULE_TOPIC, TIMER_TOPIC, decode_properties
from tide.v1 import gateway_pb2 as pb

NOW_MS = 1_700_000_000_000
WITH_TIMER = DeliveryBounds("broker-a", DEFAULT_DELAY_LEVEL_TABLE, 3 * 86_400_000, 1000)
NO_TIMER = DeliveryBounds("broker-a", DEFAULT_DELAY_LEVEL_TABLE, 0, 0)


def message(**fields: object) -> pb.ProduceMessage:
    return pb.ProduceMessage(topic="T", body=b"x", tags="A", keys=["k"], **fields)  # type: ignore[arg-type]


def test_timed_message_goes_to_the_timer_topic_under_its_slot() -> None:
    sent = message(deliver_at_ms=NOW_MS + 90_500, properties={"p": "v"})
    assert broker_delay_error("m", sent, WITH_TIMER, NOW_MS) is None
    record = scheduled_record(sent, 3, "UNIQ", WITH_TIMER, NOW_MS)
    assert (record.topic, record.queue_id) == (TIMER_TOPIC, 0)
    assert decode_properties(record.properties) == {
        "p": "v",
        "UNIQ_KEY": "UNIQ",
        "TAGS": "A",
        "KEYS": "k",
        "TIMER_DELIVER_MS": str(NOW_MS + 90_500),
        "TIMER_OUT_MS": str(NOW_MS + 90_000),
        "REAL_TOPIC": "T",
        "REAL_QID": "3",
    }
    relative = scheduled_record(message(delay_ms=2_000), 0, "U", WITH_TIMER, NOW_MS)
    assert decode_properties(relative.properties)["TIMER_DELIVER_MS"] == str(NOW_MS + 2_000)


def test_a_past_time_goes_to_the_real_queue_even_without_a_timer() -> None:
    sent = message(deliver_at_ms=NOW_MS - 1)
    assert broker_delay_error("m", sent, NO_TIMER, NOW_MS) is None
    record = scheduled_record(sent, 2, "U", NO_TIMER, NOW_MS)
    assert (record.topic, record.queue_id) == ("T", 2)
    assert decode_properties(record.properties) == {"UNIQ_KEY": "U", "TAGS": "A", "KEYS": "k"}


def test_delay_level_goes_to_its_schedule_queue() -> None:
    record = scheduled_record(message(delay_level=18), 1, "U", NO_TIMER, NOW_MS)
    assert (record.topic, record.queue_id) == (SCHEDULE_TOPIC, 17)
    assert record.properties.endswith(b"DELAY\x0118\x02REAL_TOPIC\x01T\x02REAL_QID\x011\x02")


def test_beyond_the_timer_maximum_names_it() -> None:
    sent = message(delay_ms=3 * 86_400_000 + 1)
    error = broker_delay_error("messages[2]", sent, WITH_TIMER, NOW_MS)
    assert error is not None and error.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "the maximum delay is 259200 s (timerMaxDelaySec)" in error.message
    assert "--timer-max-delay-ms" in error.message
    refused = broker_delay_error("m", sent, NO_TIMER, NOW_MS)
    assert refused is not None and refused.code is grpc.StatusCode.FAILED_PRECONDITION


def test_static_errors() -> None:
    assert static_delay_error("m", message()) is None
    assert "set one of" in (static_delay_error("m", message(delay_level=1, deliver_at_ms=5)) or "")
    assert "m.delay_ms is -5" in (static_delay_error("m", message(delay_ms=-5)) or "")
