"""The v2 edge's rules that need no cluster: polling time, invisible durations, answer
codes, endpoints, a group's retry policy as the clients take it, stored -> v2 messages."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from services.gateway.pop_errors import PopError
from services.gateway.v2.consume import (
    AUTO_RENEW_INVISIBLE_MS,
    MAX_POLLING_MS,
    MIN_POLLING_MS,
    polling_ms,
    receive_request,
)
from services.gateway.v2.messages import v2_message
from services.gateway.v2.routes import endpoints_of
from services.gateway.v2.status import V2Error, group_of, status_of
from services.gateway.v2.telemetry import _retry_policy
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb


def _receive(**fields: object) -> v2s.ReceiveMessageRequest:
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name="G"),
        message_queue=v2.MessageQueue(topic=v2.Resource(name="T")),
        batch_size=1,
        invisible_duration=Duration(seconds=30),
    )
    for name, value in fields.items():
        if isinstance(value, Duration):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)
    return request


@pytest.mark.parametrize(
    ("asked_s", "remaining_ms", "expected_ms"),
    [
        (None, 12_000, 7_000),  # no timeout asked: the time left less 5 s
        (None, None, MAX_POLLING_MS),
        (1, 30_000, MIN_POLLING_MS),  # clamped up to 5 s
        (60, 30_000, MAX_POLLING_MS),  # clamped down to 20 s
        (20, 8_000, 8_000),  # never past the call's deadline
    ],
)
def test_polling_time_follows_the_proxys_rules(
    asked_s: int | None, remaining_ms: int | None, expected_ms: int
) -> None:
    request = (
        _receive() if asked_s is None else _receive(long_polling_timeout=Duration(seconds=asked_s))
    )
    assert polling_ms(request, remaining_ms) == expected_ms


def test_too_little_time_left_is_illegal_polling_time() -> None:
    with pytest.raises(V2Error) as info:
        polling_ms(_receive(), MIN_POLLING_MS - 1)
    assert info.value.code == v2.ILLEGAL_POLLING_TIME
    assert "deadline" in info.value.message


@pytest.mark.parametrize("seconds", [9, 12 * 3600 + 1])
def test_invisible_duration_out_of_range_is_refused(seconds: int) -> None:
    request = _receive(invisible_duration=Duration(seconds=seconds))
    with pytest.raises(V2Error) as info:
        receive_request(request, 30_000, "client")
    assert info.value.code == v2.ILLEGAL_INVISIBLE_TIME
    assert "POP_INVISIBLE_MIN_MS" in info.value.message


def test_a_push_consumer_gets_the_servers_invisible_duration() -> None:
    request = _receive(auto_renew=True)
    request.ClearField("invisible_duration")
    receive = receive_request(request, 30_000, "client-1")
    assert receive.invisible_duration_ms == AUTO_RENEW_INVISIBLE_MS
    assert receive.client_id == "client-1" and receive.expression == "*"


def test_an_assigned_queue_receives_from_its_broker_only() -> None:
    request = _receive()
    request.message_queue.broker.name = "broker-b"
    receive = receive_request(request, 30_000, "")
    assert receive.queue == pb.QueueRef(broker_name="broker-b", queue_id=-1)


@pytest.mark.parametrize(
    ("error", "not_found", "code"),
    [
        (ServiceError(grpc.StatusCode.NOT_FOUND, "x"), v2.TOPIC_NOT_FOUND, v2.TOPIC_NOT_FOUND),
        (ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "x"), v2.NOT_FOUND, v2.BAD_REQUEST),
        (ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, "x"), v2.NOT_FOUND, v2.TOO_MANY_REQUESTS),
        (ServiceError(grpc.StatusCode.UNAVAILABLE, "x"), v2.NOT_FOUND, v2.INTERNAL_SERVER_ERROR),
        (
            PopError(pb.POP_ERROR_RECEIPT_HANDLE_EXPIRED, "x"),
            v2.NOT_FOUND,
            v2.INVALID_RECEIPT_HANDLE,
        ),
        (
            PopError(pb.POP_ERROR_INVALID_RECEIPT_HANDLE, "x"),
            v2.NOT_FOUND,
            v2.INVALID_RECEIPT_HANDLE,
        ),
        (RuntimeError("bug"), v2.NOT_FOUND, v2.INTERNAL_ERROR),
    ],
)
def test_errors_map_to_the_proxys_codes(
    error: Exception, not_found: v2.Code.ValueType, code: v2.Code.ValueType
) -> None:
    assert status_of(error, not_found).code == code


def test_system_groups_are_refused() -> None:
    with pytest.raises(V2Error) as info:
        group_of(v2.Resource(name="CID_RMQ_SYS_TRANS"))
    assert info.value.code == v2.ILLEGAL_CONSUMER_GROUP


@pytest.mark.parametrize(
    ("address", "scheme", "host"),
    [
        ("127.0.0.1:8081", v2.IPv4, "127.0.0.1"),
        ("[::1]:8081", v2.IPv6, "::1"),
        ("gateway.tide:8081", v2.DOMAIN_NAME, "gateway.tide"),
    ],
)
def test_endpoints_carry_a_scheme(address: str, scheme: int, host: str) -> None:
    endpoints = endpoints_of(address)
    assert endpoints.scheme == scheme
    assert endpoints.addresses[0].host == host and endpoints.addresses[0].port == 8081


def test_a_groups_retry_policy_as_the_clients_take_it() -> None:
    customized = _retry_policy(
        storage_pb.GroupConfig(
            retry_max_times=2,
            retry_policy=storage_pb.RetryPolicy(delays_ms=[1_000, 5_000, 10_000, 30_000]),
        )
    )
    assert customized.max_attempts == 3  # the first delivery counts
    # attempt r waits delays[r + 2] (tide.format retry policies): the clients index from 0
    assert [d.seconds for d in customized.customized_backoff.next] == [10, 30]
    exponential = _retry_policy(
        storage_pb.GroupConfig(
            retry_max_times=16,
            retry_policy=storage_pb.RetryPolicy(type=storage_pb.RetryPolicy.EXPONENTIAL),
        )
    )
    assert exponential.exponential_backoff.initial.seconds == 5
    assert exponential.exponential_backoff.multiplier == 2.0


def test_a_stored_message_as_v2() -> None:
    stored = storage_pb.StoredMessage(
        topic="T",
        body=b"b",
        tags="A",
        keys=["k"],
        properties={"UNIQ_KEY": "01AB", "TAGS": "A", "KEYS": "k", "__SHARDINGKEY": "g", "u": "1"},
        msg_id="7F00000100002A9F0000000000000000",
    )
    message = v2_message(stored)
    system = message.system_properties
    assert system.message_id == "01AB"
    assert system.message_type == v2.FIFO and system.message_group == "g"
    assert dict(message.user_properties) == {"u": "1"}
    assert system.body_encoding == v2.IDENTITY
