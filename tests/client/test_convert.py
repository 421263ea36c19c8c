"""Client-side checks, proto conversion, error mapping and retry backoff."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from tide.client import (
    MAX_BATCH_MESSAGES,
    InvalidArgument,
    Message,
    MessageQueue,
    NotFound,
    Producer,
    PullStatus,
    RetryPolicy,
    SendStatus,
    TideError,
    TopicNotFound,
    Unavailable,
)
from tide.client._convert import (
    _VALID_TOPICS_MAX,
    _valid_topics,
    check_topic,
    from_produce_result,
    from_produce_runs,
    from_pull_response,
    plain_produce_message,
    to_produce_message,
)
from tide.client._errors import error_from_status
from tide.client._pull_consumer import readable_queues
from tide.client._rpc import Connection
from tide.v1 import gateway_pb2, nameserver_pb2, storage_pb2


def test_produce_message_fields() -> None:
    proto = to_produce_message(
        Message("T", "héllo", tags="A", keys=["k1", "k2"], properties={"p": "v"}, sharding_key="s")
    )
    assert proto.body == "héllo".encode()
    assert list(proto.keys) == ["k1", "k2"]
    assert dict(proto.properties) == {"p": "v"}
    assert proto.WhichOneof("route") == "sharding_key"
    queued = to_produce_message(Message("T", b"x", queue=MessageQueue("T", "b", 3)))
    assert queued.WhichOneof("route") == "queue"
    assert (queued.queue.broker_name, queued.queue.queue_id) == ("b", 3)
    assert to_produce_message(Message("T", b"x")).WhichOneof("route") is None


def test_produce_message_delay_fields() -> None:
    plain = to_produce_message(Message("T", b"x"))
    assert (plain.delay_level, plain.deliver_at_ms, plain.delay_ms) == (0, 0, 0)
    assert plain.ByteSize() == to_produce_message(Message("T", b"x")).ByteSize()
    assert to_produce_message(Message("T", b"x", delay_level=3)).delay_level == 3
    assert to_produce_message(Message("T", b"x", deliver_at_ms=1234)).deliver_at_ms == 1234
    assert to_produce_message(Message("T", b"x", delay_ms=500)).delay_ms == 500


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (Message("a b", b"x"), "contains ' '"),
        (Message("", b"x"), "topic is empty"),
        (Message("T", b"x", keys=["a b"]), "contains a space"),
        (Message("T", b"x", keys="k1"), "a sequence of keys"),
        (Message("T", b"x", keys=[f"k{i}" for i in range(65)]), "at most 64"),
        (Message("T", b"x", tags="A||B"), "contains '|'"),
        (Message("T", b"x", properties={"a\x01": "v"}), "\\x01"),
        (Message("T", b"x", sharding_key="s", queue=MessageQueue("T", "b", 0)), "not both"),
        (Message("T", b"x", queue=MessageQueue("U", "b", 0)), "of topic 'U'"),
        (Message("T", 5), "give bytes or str"),  # type: ignore[arg-type]
        (Message("T", b"x", delay_level=1, delay_ms=5), "give one of delay_level"),
        (Message("T", b"x", deliver_at_ms=-5), "deliver_at_ms is -5; give an int > 0"),
        (Message("T", b"x", delay_ms=1, properties={"TRAN_MSG": "true"}), "cannot be delayed"),
    ],
)
def test_bad_messages_are_refused_before_any_call(message: Message, error: str) -> None:
    with pytest.raises(InvalidArgument, match=error.replace("\\", "\\\\").replace("(", r"\(")):
        to_produce_message(message)


@pytest.mark.parametrize(
    "body", [b"x", b"", "h\u00e9llo", bytearray(b"ab"), memoryview(b"cd"), b"y" * 1024]
)
def test_a_topic_and_a_body_build_what_their_message_builds(body: bytes | str) -> None:
    """send()'s path without a Message gives the very ProduceMessage of one."""
    plain = plain_produce_message("T", body)
    assert plain == to_produce_message(Message("T", body))
    assert plain.SerializeToString() == to_produce_message(Message("T", body)).SerializeToString()
    assert type(plain.body) is bytes


@pytest.mark.parametrize(
    ("topic", "body"), [("a b", b"x"), ("", b"x"), ("T" * 128, b"x"), ("T", 5), ("T", None)]
)
def test_a_bad_topic_or_body_is_refused_alike_without_a_message(topic: str, body: bytes) -> None:
    with pytest.raises(InvalidArgument) as from_message:
        to_produce_message(Message(topic, body))
    with pytest.raises(InvalidArgument) as plain:
        plain_produce_message(topic, body)
    assert str(plain.value) == str(from_message.value)


def test_valid_topics_are_remembered_up_to_a_bound() -> None:
    for i in range(_VALID_TOPICS_MAX + 10):
        check_topic(f"T{i}")
    assert 0 < len(_valid_topics) <= _VALID_TOPICS_MAX
    check_topic("T1")
    with pytest.raises(InvalidArgument, match="contains ' '"):
        check_topic("T 1")  # never remembered


def test_the_send_path_refuses_what_a_message_would() -> None:
    """send() of a topic and a body takes the path without a Message; the same errors."""
    with Producer("127.0.0.1:1") as producer:  # nothing listens: nothing is sent
        with pytest.raises(InvalidArgument, match="contains ' '"):
            producer.send("a b", b"x")
        with pytest.raises(InvalidArgument, match="give bytes or str"):
            producer.send("T", 5)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="a sequence of keys"):
            producer.send("T", b"x", keys="")
    with pytest.raises(TideError, match="closed"):
        producer.send("a b", b"x")  # closed first, as for any message


def test_produce_result() -> None:
    result = from_produce_result(
        "T",
        gateway_pb2.ProduceResult(
            status=gateway_pb2.ProduceResult.FLUSH_DISK_TIMEOUT,
            msg_id="ID",
            broker_name="b",
            queue_id=2,
            queue_offset=9,
        ),
    )
    assert result.status is SendStatus.FLUSH_DISK_TIMEOUT
    assert result.written
    assert result.queue == MessageQueue("T", "b", 2)
    failed = from_produce_result(
        "T", gateway_pb2.ProduceResult(status=gateway_pb2.ProduceResult.SEND_FAILED, error="x")
    )
    assert not failed.written
    assert failed.error == "x"


def test_produce_runs_expand_to_the_same_results() -> None:
    """A compact answer's runs give what a result per message would."""
    Run, Result = gateway_pb2.ProduceRun, gateway_pb2.ProduceResult
    runs = [
        Run(first_index=0, count=2, broker_name="b", queue_id=1, first_queue_offset=7,
            msg_id_prefix="P", physical_offsets=[16, 255], unique_keys=["u0", "u1"],
            store_timestamp_ms=3),
        Run(first_index=2, count=1, status=Result.SEND_FAILED, unique_keys=["u2"], error="e"),
        Run(first_index=3, count=1, status=Result.FLUSH_SLAVE_TIMEOUT, broker_name="c",
            queue_id=0, first_queue_offset=1, msg_id_prefix="Q", physical_offsets=[1],
            unique_keys=["u3"]),
    ]  # fmt: skip
    expected = [
        Result(msg_id=f"P{16:016X}", unique_key="u0", broker_name="b", queue_id=1,
               queue_offset=7, store_timestamp_ms=3),
        Result(msg_id=f"P{255:016X}", unique_key="u1", broker_name="b", queue_id=1,
               queue_offset=8, store_timestamp_ms=3),
        Result(status=Result.SEND_FAILED, unique_key="u2", error="e"),
        Result(status=Result.FLUSH_SLAVE_TIMEOUT, msg_id=f"Q{1:016X}", unique_key="u3",
               broker_name="c", queue_id=0, queue_offset=1),
    ]  # fmt: skip
    topics = ["T", "T", "U", "T"]
    assert from_produce_runs(topics, runs) == [
        from_produce_result(topic, result) for topic, result in zip(topics, expected, strict=True)
    ]
    # made without the dataclass's __init__: the very same value objects
    for result, made in zip(
        from_produce_runs(topics, runs),
        [from_produce_result(t, r) for t, r in zip(topics, expected, strict=True)],
        strict=True,
    ):
        assert (hash(result), repr(result)) == (hash(made), repr(made))
        assert dataclasses.asdict(result) == dataclasses.asdict(made)
        assert dataclasses.replace(result, error="z") == dataclasses.replace(made, error="z")
        assert result.written == made.written
        with pytest.raises(dataclasses.FrozenInstanceError):
            result.error = "z"  # type: ignore[misc]
    with pytest.raises(TideError, match="cover 3 of 4"):
        from_produce_runs(topics, runs[:2])
    with pytest.raises(TideError, match="in order"):
        from_produce_runs(topics, [runs[1]])
    with pytest.raises(TideError, match="more than 3"):
        from_produce_runs(topics[:3], runs)
    with pytest.raises(TideError, match="lacks physical offsets"):
        from_produce_runs(["T"], [Run(count=1, unique_keys=["u"])])


def test_pull_response() -> None:
    queue = MessageQueue("T", "b", 1)
    result = from_pull_response(
        queue,
        gateway_pb2.PullResponse(
            status=gateway_pb2.PullResponse.FOUND,
            messages=[
                storage_pb2.StoredMessage(
                    topic="T",
                    queue_id=1,
                    queue_offset=4,
                    body=b"b",
                    keys=["k"],
                    properties={"UNIQ_KEY": "U1", "TAGS": "A"},
                    tags="A",
                    size=99,
                )
            ],
            next_offset=5,
            min_offset=0,
            max_offset=5,
        ),
    )
    assert result.status is PullStatus.FOUND
    [message] = result.messages
    assert message.queue == queue
    assert (message.queue_offset, message.unique_key, message.keys) == (4, "U1", ("k",))
    assert message.size_bytes == 99
    with pytest.raises(TideError, match="unknown status"):
        from_pull_response(
            queue, gateway_pb2.PullResponse(status=gateway_pb2.PullResponse.STATUS_UNSPECIFIED)
        )


def _queue_data(broker: str, *, read: int, perm: int) -> nameserver_pb2.QueueData:
    return nameserver_pb2.QueueData(
        broker_name=broker, read_queue_nums=read, write_queue_nums=read, perm=perm
    )


def test_readable_queues_follow_read_counts_and_perm() -> None:
    route = nameserver_pb2.TopicRoute(
        topic="T",
        queue_datas=[
            nameserver_pb2.QueueData(
                broker_name="b", read_queue_nums=2, write_queue_nums=4, perm=6
            ),
            nameserver_pb2.QueueData(
                broker_name="a", read_queue_nums=1, write_queue_nums=1, perm=6
            ),
            nameserver_pb2.QueueData(
                broker_name="c", read_queue_nums=8, write_queue_nums=8, perm=2
            ),
        ],
    )
    assert readable_queues(route) == [
        MessageQueue("T", "a", 0),
        MessageQueue("T", "b", 0),
        MessageQueue("T", "b", 1),
    ]


@pytest.mark.parametrize(
    ("code", "details", "cls"),
    [
        (
            grpc.StatusCode.NOT_FOUND,
            "topic 'T' does not exist (no live broker serves it)",
            TopicNotFound,
        ),
        (grpc.StatusCode.NOT_FOUND, "topic 'T' has no queues on any live broker", TopicNotFound),
        (grpc.StatusCode.NOT_FOUND, "broker 'b' does not serve topic 'T'", NotFound),
        (grpc.StatusCode.NOT_FOUND, "queue_id 9 is out of range: topic 'T' has 4", NotFound),
        (grpc.StatusCode.UNAVAILABLE, "no broker", Unavailable),
        (grpc.StatusCode.INVALID_ARGUMENT, "messages[0].body", InvalidArgument),
        (grpc.StatusCode.INTERNAL, "boom", TideError),
    ],
)
def test_error_mapping(code: grpc.StatusCode, details: str, cls: type[TideError]) -> None:
    error = error_from_status(code, details, "Produce to 'T'")
    assert type(error) is cls
    assert error.code is code
    assert str(error) == f"Produce to 'T' failed: {details} [{code.name}]"


def test_retry_backoff_doubles_up_to_the_cap() -> None:
    policy = RetryPolicy(max_attempts=5, initial_backoff_ms=100, max_backoff_ms=300)
    assert [policy.backoff_ms(n) for n in (1, 2, 3, 4)] == [100, 200, 300, 300]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": 11},
        {"initial_backoff_ms": 500, "max_backoff_ms": 100},
        {"multiplier": 0.5},
    ],
)
def test_retry_policy_limits(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_connection_and_producer_limits() -> None:
    with pytest.raises(InvalidArgument, match="HOST:PORT"):
        Connection("localhost")
    with pytest.raises(InvalidArgument, match="max_in_flight"):
        Producer(max_in_flight=0)
    with Producer("127.0.0.1:1") as producer, pytest.raises(InvalidArgument, match="limit"):
        producer.send_batch([Message("T", b"x")] * 1025)


def test_unreachable_gateway_is_unavailable_after_the_retries() -> None:
    policy = RetryPolicy(max_attempts=2, initial_backoff_ms=1, max_backoff_ms=1)
    with (
        Producer("127.0.0.1:1", retry=policy, rpc_timeout_ms=2_000) as producer,
        pytest.raises(Unavailable, match="Produce to 'T' failed"),
    ):
        producer.send("T", b"x")


def test_a_batch_larger_than_the_gateway_takes_fails_before_it_is_sent() -> None:
    body = b"x" * (65 * 1024)  # 1024 of them: 65 MiB, past the gateway's 64 MiB
    too_large = pytest.raises(InvalidArgument, match=r"takes requests up to 67108864 bytes")
    with Producer("127.0.0.1:1") as producer, too_large:  # nothing listens: nothing sent
        producer.send_batch([Message("T", body)] * MAX_BATCH_MESSAGES)
