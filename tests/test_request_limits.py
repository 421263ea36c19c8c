"""Every RPC of every service, with each string field one past its bound and each
repeated or map field one entry past its bound, answers a clear status naming the field
(INVALID_ARGUMENT, RESOURCE_EXHAUSTED or OUT_OF_RANGE; in-band for the streams that
answer in-band) whose message is bounded in length: never UNKNOWN, INTERNAL or a
transport error from a status message too large for gRPC's metadata.

Methods and fields come from the generated descriptors, so a new RPC or field is swept
without a change here, and a request field without a bound in tide.limits fails
:func:`test_every_request_field_has_a_bound`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from tests._cluster import Cluster, cluster_fixture
from tide.limits import BY_OPTION, FIELD_LIMITS, IN_BAND_STREAMS, LIMITS, quote
from tide.quoting import quote_all
from tide.v1 import dispatch_pb2, gateway_pb2, nameserver_pb2, storage_pb2, storage_pb2_grpc

cluster = cluster_fixture(brokers=1)

RPC_TIMEOUT_S = 20.0
# A status message may repeat a field's value only cut short (tide.limits.quote).
MAX_DETAILS_CHARS = 1_000
# A field bounded by a service option gets this many entries (every option is lower).
OPTION_OVERSIZE_COUNT = 200_001
CLEAR_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.OUT_OF_RANGE,
}
SERVICES = [
    module.DESCRIPTOR.services_by_name[name]
    for module, name in (
        (storage_pb2, "Storage"),
        (dispatch_pb2, "Dispatch"),
        (nameserver_pb2, "NameServer"),
        (gateway_pb2, "Gateway"),
    )
]
METHODS = [method for service in SERVICES for method in service.methods]


@dataclass(frozen=True)
class Case:
    """One oversize field of one method's request: ``path`` is the field names from the
    request down (an element of a repeated message field is its first one)."""

    method: MethodDescriptor
    path: tuple[FieldDescriptor, ...]
    element: bool  # oversize one element (a key, a property's value), not the count

    @property
    def id(self) -> str:
        names = ".".join(field.name for field in self.path)
        return f"{self.method.full_name}:{names}{'[0]' if self.element else ''}"


def _is_map(field: FieldDescriptor) -> bool:
    entry = field.message_type
    return entry is not None and bool(entry.GetOptions().map_entry)


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _bounded_paths(
    descriptor: Descriptor, seen: frozenset[str] = frozenset()
) -> Iterator[tuple[FieldDescriptor, ...]]:
    """Every string, repeated or map field reachable from ``descriptor``."""
    for field in descriptor.fields:
        if _is_repeated(field) or field.type == FieldDescriptor.TYPE_STRING:
            yield (field,)
        nested = field.message_type
        if nested is not None and not _is_map(field) and nested.full_name not in seen:
            for rest in _bounded_paths(nested, seen | {descriptor.full_name}):
                yield (field, *rest)


def _cases() -> list[Case]:
    cases = []
    for method in METHODS:
        for path in _bounded_paths(method.input_type):
            last = path[-1]
            cases.append(Case(method, path, element=False))
            element_string = _is_repeated(last) and last.type == FieldDescriptor.TYPE_STRING
            if _is_map(last) or element_string:
                cases.append(Case(method, path, element=True))
    return cases


CASES = _cases()


def _limit(field: FieldDescriptor, element: bool) -> int | None:
    """The field's bound (None: a service option's)."""
    if element:
        name = "KEY_MAX_CHARS" if field.name == "keys" else None
        name = name or ("PROPERTIES_MAX_BYTES" if _is_map(field) else None)
        if name is None:
            name = {
                "topics": "TOPIC_MAX_BYTES",
                "broker_names": "NAME_MAX_CHARS",
                "tags": "TAG_MAX_CHARS",
                "actions": "AUTH_WORD_MAX_CHARS",  # acl (issue 22)
                "source_ips": "AUTH_WORD_MAX_CHARS",
            }[field.name]
        return LIMITS[name]
    name = FIELD_LIMITS[field.full_name]
    return None if name == BY_OPTION else LIMITS[name]


def _oversize(message: Message, field: FieldDescriptor, element: bool) -> None:
    """Set ``field`` of ``message`` one past its bound."""
    limit = _limit(field, element)
    size = OPTION_OVERSIZE_COUNT if limit is None else limit + 1
    value: Any = getattr(message, field.name)
    if _is_map(field):
        if element:
            value["name"] = "v" * size
        else:
            value.update({f"p{index}": "v" for index in range(size)})
    elif _is_repeated(field):
        if element:
            value.append("k" * size)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            assert field.message_type is not None
            element_class = GetMessageClass(field.message_type)
            value.extend([element_class() for _ in range(size)])
        elif field.type == FieldDescriptor.TYPE_STRING:
            value.extend([f"k{index}" for index in range(size)])
        elif field.type == FieldDescriptor.TYPE_BYTES:
            value.extend([b""] * size)
        else:
            value.extend([1] * size)
    else:
        setattr(message, field.name, "x" * size)


def _request(case: Case) -> tuple[Message, Message]:
    """An empty request of the case's method, and the message along its path holding
    the field under test (repeated messages on the way get one element each)."""
    request = GetMessageClass(case.method.input_type)()
    target = request
    for field in case.path[:-1]:
        if _is_repeated(field):
            target = getattr(target, field.name).add()
        else:
            target = getattr(target, field.name)
    return request, target


def _path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def _call(channel: grpc.Channel, method: MethodDescriptor, request: Message) -> Any:
    """Call ``method`` with ``request`` (a stream of one request for a streamed method);
    returns the response (the first one of a response stream)."""
    path = _path(method)
    output = GetMessageClass(method.output_type)
    kwargs: dict[str, Any] = {
        "request_serializer": type(request).SerializeToString,
        "response_deserializer": output.FromString,
    }
    streamed_in, streamed_out = method.client_streaming, method.server_streaming
    if not streamed_in and not streamed_out:
        return channel.unary_unary(path, **kwargs)(request, timeout=RPC_TIMEOUT_S)
    if not streamed_in:
        responses = channel.unary_stream(path, **kwargs)(request, timeout=RPC_TIMEOUT_S)
        return next(iter(responses))
    if not streamed_out:
        return channel.stream_unary(path, **kwargs)(iter([request]), timeout=RPC_TIMEOUT_S)
    responses = channel.stream_stream(path, **kwargs)(iter([request]), timeout=RPC_TIMEOUT_S)
    return next(iter(responses))


def _channel(cluster: Cluster, service: str) -> grpc.Channel:
    broker = cluster.brokers[0]
    channels = {
        "tide.v1.Storage": broker.storage.channel,
        "tide.v1.Dispatch": broker.dispatch.channel,
        "tide.v1.NameServer": cluster.nameservers[0].channel,
        "tide.v1.Gateway": cluster.gateway.channel,
    }
    return channels[service]


def _check_details(case: Case, code: grpc.StatusCode, details: str) -> None:
    assert code in CLEAR_CODES, f"{case.id}: {code.name}: {details[:300]}"
    assert len(details) <= MAX_DETAILS_CHARS, f"{case.id}: {len(details)} chars: {details[:300]}"
    field = case.path[-1]
    wanted = {field.name, field.name.rstrip("s")}
    limit_name = FIELD_LIMITS.get(field.full_name)
    if limit_name and limit_name != BY_OPTION:
        wanted.add(limit_name)
    assert any(name in details for name in wanted), (
        f"{case.id}: the status names neither the field nor its limit ({sorted(wanted)}): {details}"
    )


def _expect_refused(cluster: Cluster, case: Case, request: Message) -> None:
    """``request`` is refused with a clear, bounded status naming the field or its limit:
    as the call's status, or in the response for the streams that answer in-band
    (AppendStream, ReadStream, GetQueueEntriesStream, ProduceStream)."""
    channel = _channel(cluster, case.method.containing_service.full_name)
    try:
        response = _call(channel, case.method, request)
    except grpc.RpcError as error:
        assert isinstance(error, grpc.Call), error
        _check_details(case, error.code(), error.details() or "")
        assert _path(case.method) not in IN_BAND_STREAMS, f"{case.id}: not answered in-band"
        return
    code = getattr(response, "error_code", 0)
    assert code, f"{case.id}: accepted: {str(response)[:300]}"
    _check_details(case, grpc.StatusCode(_code_of(code)), response.error_message)


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_oversize_field_gets_a_clear_bounded_status(cluster: Cluster, case: Case) -> None:
    request, target = _request(case)
    _oversize(target, case.path[-1], case.element)
    _expect_refused(cluster, case, request)


STRING_CASES = [
    case
    for case in CASES
    if case.path[-1].type == FieldDescriptor.TYPE_STRING and not _is_repeated(case.path[-1])
]
HUGE_CHARS = 100_000  # the QueryMessage(msg_id="x" * 100000): past gRPC's metadata


@pytest.mark.parametrize("case", STRING_CASES, ids=[case.id for case in STRING_CASES])
def test_huge_string_is_not_repeated_in_the_status(cluster: Cluster, case: Case) -> None:
    request, target = _request(case)
    setattr(target, case.path[-1].name, "x" * HUGE_CHARS)
    _expect_refused(cluster, case, request)


def _code_of(value: int) -> tuple[int, str]:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code.value  # type: ignore[no-any-return]
    raise AssertionError(f"no status code {value}")


def test_every_request_field_has_a_bound() -> None:
    """A string, repeated or map field of any request has a bound in tide.limits."""
    missing = sorted(
        {
            path[-1].full_name
            for method in METHODS
            for path in _bounded_paths(method.input_type)
            if path[-1].full_name not in FIELD_LIMITS
        }
    )
    assert not missing, f"request fields without a bound in tide.limits.FIELD_LIMITS: {missing}"


def test_quote_cuts_long_values_and_says_their_length() -> None:
    assert quote("abc") == "'abc'"
    text = quote("x" * 100_000)
    assert text.startswith("'" + "x" * 64 + "'...")
    assert "100000 characters" in text
    assert len(text) < 100
    assert "bytes" in quote(b"y" * 1000)
    assert quote_all(["a", "b"]) == "'a', 'b'"
    many = quote_all(["z" * 1000] * 1000)
    assert many.endswith("and 995 more") and len(many) < 600


def test_an_in_band_stream_goes_on_after_a_request_past_a_bound(cluster: Cluster) -> None:
    """A request past a bound on a stream that answers in-band is answered like any bad
    request, and the stream serves the next one."""
    too_many = storage_pb2.ReadRequest(
        positions=[storage_pb2.ReadRequest.Position()] * (LIMITS["READ_MAX_POSITIONS"] + 1)
    )
    fine = storage_pb2.ReadRequest(positions=[storage_pb2.ReadRequest.Position(size=0)])
    stub = storage_pb2_grpc.StorageStub(cluster.brokers[0].storage.channel)
    first, second = list(stub.ReadStream(iter([too_many, fine]), timeout=RPC_TIMEOUT_S))
    assert first.error_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "READ_MAX_POSITIONS" in first.error_message
    assert second.error_code == 0 and len(second.response.results) == 1, second
