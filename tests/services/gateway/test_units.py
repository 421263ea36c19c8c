"""Pure logic of the gateway: fault tolerance, queue selection, expressions, unique keys,
option checks."""

from __future__ import annotations

import math
import random
from collections import Counter
from datetime import datetime

import pytest

from services.gateway.expression import ExpressionError, parse_expression
from services.gateway.fault import LatencyFaultTolerance, not_available_duration_ms
from services.gateway.options import OPTIONS, check_config, split_addresses
from services.gateway.pull import Status, _by_range
from services.gateway.routes import QueueRef, TopicView
from services.gateway.selection import QueueSelector, by_sharding_key, hash_index
from services.gateway.uniq import UniqueKeyGenerator, month_bounds_ms
from tide.format import java_string_hashcode, tags_code
from tide.limits import EXPRESSION_MAX_TAGS
from tide.server import load_config
from tide.v1 import nameserver_pb2 as ns_pb


class FakeClock:
    def __init__(self) -> None:
        self.now_ms = 1_000_000.0

    def __call__(self) -> float:
        return self.now_ms


# -- fault tolerance ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("latency_ms", "duration_ms"),
    [
        (0, 0),
        (49, 0),
        (99, 0),
        (549, 0),
        (550, 30_000),
        (999, 30_000),
        (1_000, 60_000),
        (2_000, 120_000),
        (3_000, 180_000),
        (14_999, 180_000),
        (15_000, 600_000),
        (90_000, 600_000),
    ],
)
def test_not_available_duration_follows_rocketmq_table(latency_ms: int, duration_ms: int) -> None:
    assert not_available_duration_ms(latency_ms) == duration_ms


def test_slow_broker_is_avoided_for_the_penalty_then_available() -> None:
    clock = FakeClock()
    fault = LatencyFaultTolerance(clock_ms=clock)
    fault.update("b1", 20)
    assert fault.is_available("b1")
    fault.update("b1", 1_200)  # 60 s penalty
    assert not fault.is_available("b1")
    clock.now_ms += 59_999
    assert not fault.is_available("b1")
    clock.now_ms += 1
    assert fault.is_available("b1")
    assert fault.is_available("never-seen")


def test_failure_isolates_for_the_isolation_time_and_a_fast_answer_clears_it() -> None:
    clock = FakeClock()
    fault = LatencyFaultTolerance(isolation_ms=5_000, clock_ms=clock)
    fault.update("b1", 3, isolation=True)
    assert not fault.is_available("b1")
    clock.now_ms += 5_000
    assert fault.is_available("b1")
    fault.update("b1", 3, isolation=True)
    fault.update("b1", 3)  # then a fast answer
    assert fault.is_available("b1")


def test_disabled_fault_tolerance_keeps_every_broker() -> None:
    fault = LatencyFaultTolerance(enabled=False, clock_ms=FakeClock())
    fault.update("b1", 20_000, isolation=True)
    assert fault.is_available("b1")


def test_least_bad_is_the_one_available_soonest() -> None:
    clock = FakeClock()
    fault = LatencyFaultTolerance(clock_ms=clock)
    fault.update("b1", 16_000)  # 600 s
    fault.update("b2", 1_500)  # 60 s
    assert fault.least_bad(["b1", "b2"]) == "b2"
    assert fault.least_bad(["b1", "b2", "b3"]) == "b3"  # unknown: never penalised
    assert fault.least_bad([]) is None


# -- queue selection ---------------------------------------------------------------
QUEUES = tuple(QueueRef(broker, qid) for broker in ("a", "b") for qid in range(4))


def selector(fault: LatencyFaultTolerance | None = None) -> QueueSelector:
    return QueueSelector(fault or LatencyFaultTolerance(clock_ms=FakeClock()), random.Random(7))


def test_round_robin_visits_every_queue_evenly() -> None:
    select = selector()
    chosen = [select.round_robin("T", QUEUES) for _ in range(80)]
    assert Counter(chosen) == {queue: 10 for queue in QUEUES}


def test_round_robin_counters_are_per_topic() -> None:
    select = selector()
    first_t = select.round_robin("T", QUEUES)
    for _ in range(3):
        select.round_robin("U", QUEUES)
    second_t = select.round_robin("T", QUEUES)
    assert second_t == QUEUES[(QUEUES.index(first_t) + 1) % len(QUEUES)]


def test_round_robin_skips_unavailable_and_excluded_brokers() -> None:
    fault = LatencyFaultTolerance(clock_ms=FakeClock())
    fault.update("a", 0, isolation=True)
    select = selector(fault)
    assert {select.round_robin("T", QUEUES).broker_name for _ in range(20)} == {"b"}  # type: ignore[union-attr]
    assert select.round_robin("T", QUEUES, excluded={"b"}) is not None  # "a" is all that is left
    assert select.round_robin("T", QUEUES, excluded={"a", "b"}) is None
    assert select.round_robin("T", ()) is None


def test_round_robin_with_every_broker_penalised_picks_the_least_bad() -> None:
    fault = LatencyFaultTolerance(clock_ms=FakeClock())
    fault.update("a", 16_000)
    fault.update("b", 600)
    select = selector(fault)
    chosen = {select.round_robin("T", QUEUES) for _ in range(10)}
    assert {queue.broker_name for queue in chosen if queue} == {"b"}


def test_sharding_key_is_sticky_and_matches_rocketmq_hash() -> None:
    for key in ("order-1", "order-2", "客户-7", ""):
        # Java's % keeps the dividend's sign (math.fmod does too); then Math.abs.
        index = abs(int(math.fmod(java_string_hashcode(key), len(QUEUES))))
        assert hash_index(key, len(QUEUES)) == index
        assert by_sharding_key(QUEUES, key) == QUEUES[index]
    spread = {by_sharding_key(QUEUES, f"k{i}") for i in range(200)}
    assert len(spread) == len(QUEUES)


def test_sharding_key_falls_back_to_the_same_queue_of_another_broker() -> None:
    keys = [f"k{i}" for i in range(50)]
    on_a = [key for key in keys if by_sharding_key(QUEUES, key).broker_name == "a"]  # type: ignore[union-attr]
    assert on_a
    for key in on_a:
        fallback = by_sharding_key(QUEUES, key, excluded={"a"})
        assert fallback is not None and fallback.broker_name == "b"
        assert by_sharding_key(QUEUES, key, excluded={"a"}) == fallback
    assert by_sharding_key(QUEUES, "k", excluded={"a", "b"}) is None


def test_writable_queues_need_write_perm_and_a_live_master() -> None:
    route = ns_pb.TopicRoute(
        topic="T",
        queue_datas=[
            ns_pb.QueueData(broker_name="b", read_queue_nums=2, write_queue_nums=2, perm=6),
            ns_pb.QueueData(broker_name="a", read_queue_nums=3, write_queue_nums=3, perm=6),
            ns_pb.QueueData(broker_name="ro", read_queue_nums=2, write_queue_nums=2, perm=4),
            ns_pb.QueueData(broker_name="slave", read_queue_nums=2, write_queue_nums=2, perm=6),
        ],
        broker_datas=[
            ns_pb.BrokerData(
                cluster_name="C",
                broker_name=name,
                addresses={1 if name == "slave" else 0: ns_pb.BrokerAddress(storage=f"{name}:1")},
            )
            for name in ("a", "b", "ro", "slave")
        ],
    )
    view = TopicView(route)
    assert view.writable == (
        QueueRef("a", 0),
        QueueRef("a", 1),
        QueueRef("a", 2),
        QueueRef("b", 0),
        QueueRef("b", 1),
    )
    assert view.master("slave") is None
    reader = view.reader("slave")
    assert reader is not None and reader.broker_id == 1
    assert [member.broker_name for member in view.masters()] == ["a", "b", "ro"]


# -- expressions ---------------------------------------------------------------------
@pytest.mark.parametrize("expression", ["", "*", " * ", "  "])
def test_match_all_expressions(expression: str) -> None:
    parsed = parse_expression(expression)
    assert parsed.matches_all and parsed.codes == ()
    assert parsed.matches("anything") and parsed.matches("")


def test_tag_list_expression() -> None:
    parsed = parse_expression(" TagA ||TagB|| TagA ")
    assert parsed.tags == {"TagA", "TagB"}
    assert parsed.codes == tuple(sorted({tags_code("TagA"), tags_code("TagB")}))
    assert parsed.matches("TagA") and parsed.matches("TagB")
    assert not parsed.matches("TagC") and not parsed.matches("")
    assert parse_expression("Tag With Space").matches("Tag With Space")


def test_hash_collisions_are_told_apart_by_the_real_tag() -> None:
    # "Aa" and "BB" share Java's hash code.
    assert tags_code("Aa") == tags_code("BB")
    parsed = parse_expression("Aa")
    assert parsed.codes == (tags_code("BB"),)
    assert parsed.matches("Aa") and not parsed.matches("BB")


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("A ||", "tag 2 is empty"),
        ("|| B", "tag 1 is empty"),
        ("A || || B", "tag 2 is empty"),
        ("A | B", "contains '|'"),
        ("A ||| B", "contains '|'"),
        ("A || *", "contains '*'"),
        ("Ta*g", "contains '*'"),
        ("A\x01", "contains '\\x01'"),
    ],
)
def test_bad_expressions(expression: str, fragment: str) -> None:
    with pytest.raises(ExpressionError) as info:
        parse_expression(expression)
    assert fragment in str(info.value)


def test_expression_limits() -> None:
    with pytest.raises(ExpressionError, match="characters"):
        parse_expression("A" * 5000)
    with pytest.raises(ExpressionError, match="tags"):
        parse_expression(" || ".join(f"T{i}" for i in range(EXPRESSION_MAX_TAGS + 1)))


# -- unique keys ---------------------------------------------------------------------
def test_unique_key_layout() -> None:
    base_ms = month_bounds_ms(int(datetime(2026, 3, 15, 12).timestamp() * 1000))[0]
    now = [base_ms + 0x1234]
    generator = UniqueKeyGenerator(
        ip=bytes([10, 1, 2, 3]), pid=0x12345, process_value=0xDEADBEEF, clock_ms=lambda: now[0]
    )
    first = generator.next()
    assert len(first) == 32 and first == first.upper()
    assert first[:8] == "0A010203"  # ip
    assert first[8:12] == "2345"  # pid as a Java short
    assert first[12:20] == "DEADBEEF"  # per-process value
    assert first[20:28] == "00001234"  # ms since the month began
    assert first[28:] == "0000"  # counter
    assert generator.next()[28:] == "0001"
    assert generator.prefix == first[:20]


def test_unique_keys_differ_and_the_counter_wraps() -> None:
    generator = UniqueKeyGenerator(ip=bytes(4), pid=1, process_value=1, clock_ms=lambda: 10**12)
    keys = [generator.next() for _ in range(65_537)]
    assert len(set(keys[:65_536])) == 65_536
    assert keys[65_536] == keys[0]  # same time, counter wrapped: RocketMQ's limit too


def test_unique_key_time_base_moves_at_the_month_end() -> None:
    start, following = month_bounds_ms(int(datetime(2026, 12, 20).timestamp() * 1000))
    assert datetime.fromtimestamp(start / 1000) == datetime(2026, 12, 1)
    assert datetime.fromtimestamp(following / 1000) == datetime(2027, 1, 1)
    now = [following - 1]
    generator = UniqueKeyGenerator(ip=bytes(4), pid=1, process_value=1, clock_ms=lambda: now[0])
    assert int(generator.next()[20:28], 16) == following - 1 - start
    now[0] = following + 5
    assert int(generator.next()[20:28], 16) == 5


def test_two_generators_differ_in_the_per_process_value() -> None:
    first = UniqueKeyGenerator(ip=bytes(4), pid=1, process_value=1)
    second = UniqueKeyGenerator(ip=bytes(4), pid=1, process_value=2)
    assert first.prefix != second.prefix


# -- pull offsets by range -----------------------------------------------------------
def test_pull_answers_by_range() -> None:
    assert (_by_range(0, 0, 0).status, _by_range(0, 0, 0).next_offset) == (
        Status.NO_NEW_MESSAGE,
        0,
    )
    too_small = _by_range(2, 5, 9)
    assert (too_small.status, too_small.next_offset) == (Status.OFFSET_ILLEGAL, 5)
    too_big = _by_range(12, 5, 9)
    assert (too_big.status, too_big.next_offset) == (Status.OFFSET_ILLEGAL, 9)
    assert _by_range(9, 5, 9).status == Status.NO_NEW_MESSAGE


# -- options -------------------------------------------------------------------------
def test_option_checks() -> None:
    assert split_addresses(" a:1; ;b:2 ") == ("a:1", "b:2")
    assert check_config(load_config("gateway", OPTIONS, [])) is None
    bad = {
        "--namesrv=": "at least one name server",
        "--namesrv=host": "expected HOST:PORT",
        "--namesrv=a:1;b:99999": "expected HOST:PORT",
        "--produce-retries=17": "--produce-retries: 17 is outside 0..16",
        "--max-message-body-bytes=0": "--max-message-body-bytes",
        "--max-long-poll-ms=-1": "--max-long-poll-ms",
        "--appends-in-flight=0": "--appends-in-flight: 0 is outside 1..16",
        "--appends-in-flight=17": "--appends-in-flight: 17 is outside 1..16",
    }
    for flag, fragment in bad.items():
        problem = check_config(load_config("gateway", OPTIONS, [flag]))
        assert problem is not None and fragment in problem, (flag, problem)
