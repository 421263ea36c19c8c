"""Authenticates and authorizes every call of the gateway's two services while security
is on (``--auth-enabled``); health and reflection stay open (probes).

tide.v1 answers UNAUTHENTICATED (no valid signature, unknown user, expired date-time) or
PERMISSION_DENIED naming the action and resource. RocketMQ 5 clients read errors in-band,
so a v2 call answers its own response type with status UNAUTHORIZED (40100) or FORBIDDEN
(40300); the Telemetry stream, which has no such answer, ends with the gRPC status.
A stream's requests are each authorized as they come (a ProduceStream may name new topics).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeAlias

import grpc
from google.protobuf import message_factory

from services.gateway.auth.actions import ACTIONS, V2, Need
from services.gateway.auth.admin import CALLER
from services.gateway.auth.audit import Audit
from services.gateway.auth.authority import Authority
from tide.auth.model import User, UserType
from tide.auth.signature import AuthenticationError
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2_service
from tide.server import ServiceError
from tide.server._peer import peer_address

Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"
_OPEN_PREFIXES = ("/grpc.health.", "/grpc.reflection.")
_FACTORIES: dict[str, Callable[..., Handler]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


class Refused(Exception):
    def __init__(self, reason: str, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code
        self.message = message


def source_ip(context: Context) -> str:
    """The caller's IP address (no port), empty without one."""
    host = peer_address(context.peer()).rpartition(":")[0]
    return host.strip("[]")


class Gate:
    """The check of one method: authenticate the call, authorize each request."""

    def __init__(self, method: str, authority: Authority, audit: Audit) -> None:
        self.method = method
        self._authority = authority
        self._audit = audit
        self._needs = ACTIONS.get(method)

    def authenticate(self, context: Context) -> User:
        metadata = context.invocation_metadata() or ()
        try:
            user = self._authority.authenticate(tuple(metadata))
        except AuthenticationError as exc:
            self._refuse(context, "unauthenticated", "", "", str(exc))
            raise Refused("unauthenticated", grpc.StatusCode.UNAUTHENTICATED, str(exc)) from None
        CALLER.set(user.access_key)  # for the audit of user and ACL changes
        return user

    def authorize(self, user: User, request: Any, context: Context) -> None:
        if self._needs is None:  # not in the table: nobody but a super user
            needs: list[Need] = []
            if user.user_type is not UserType.SUPER:
                message = f"{self.method} is not in the gateway's action table"
                self._refuse(context, "unknown_method", user.access_key, "", message)
                raise Refused("unknown_method", grpc.StatusCode.PERMISSION_DENIED, message)
        else:
            needs = self._needs(request)
        denial = self._authority.authorize(user, needs, source_ip(context))
        if denial is not None:
            message = denial.message(user.access_key)
            self._refuse(context, "forbidden", user.access_key, str(denial.resource), message)
            raise Refused("forbidden", grpc.StatusCode.PERMISSION_DENIED, message)

    def _refuse(self, context: Context, reason: str, who: str, resource: str, detail: str) -> None:
        address = peer_address(context.peer())
        self._audit.denied(reason, who, self.method, resource, address, detail)


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    def __init__(self, authority: Authority, audit: Audit) -> None:
        self._authority = authority
        self._audit = audit
        self._wrapped: dict[str, tuple[Handler, Handler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler: Handler | None = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_OPEN_PREFIXES):
            return handler  # type: ignore[return-value]
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _wrap(handler, Gate(method, self._authority, self._audit))
        self._wrapped[method] = (handler, wrapped)
        return wrapped


def _wrap(handler: Handler, gate: Gate) -> Handler:
    for kind, factory in _FACTORIES.items():
        behaviour = getattr(handler, kind)
        if behaviour is None:
            continue
        in_band = _in_band_answer(gate.method)
        if kind == "unary_unary":
            wrapped = _unary_unary(behaviour, gate, in_band)
        elif kind == "unary_stream":
            wrapped = _unary_stream(behaviour, gate, in_band)
        elif kind == "stream_unary":
            wrapped = _stream_unary(behaviour, gate)
        else:
            wrapped = _stream_stream(behaviour, gate)
        return factory(
            wrapped,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return handler


InBand: TypeAlias = "Callable[[Refused], Any] | None"
_V2_CODES = {"unauthenticated": v2.UNAUTHORIZED}


def _in_band_answer(method: str) -> InBand:
    """For a v2 method: the response type with the refusal as its status."""
    if not method.startswith(V2):
        return None
    descriptor = v2_service.DESCRIPTOR.services_by_name["MessagingService"]
    output = descriptor.methods_by_name[method[len(V2) :]].output_type
    response_class = message_factory.GetMessageClass(output)
    if "status" not in output.fields_by_name:
        return None

    def answer(refused: Refused) -> Any:
        code = _V2_CODES.get(refused.reason, v2.FORBIDDEN)
        return response_class(status=v2.Status(code=code, message=refused.message))

    return answer


async def _abort(context: Context, refused: Refused) -> None:
    await context.abort(refused.code, refused.message)


def _unary_unary(behaviour: Any, gate: Gate, in_band: InBand) -> Any:
    async def wrapped(request: Any, context: Context) -> Any:
        try:
            gate.authorize(gate.authenticate(context), request, context)
        except Refused as refused:
            if in_band is not None:
                return in_band(refused)
            await _abort(context, refused)
        return await behaviour(request, context)

    return wrapped


def _unary_stream(behaviour: Any, gate: Gate, in_band: InBand) -> Any:
    if not inspect.isasyncgenfunction(behaviour):  # answers with context.write

        async def written(request: Any, context: Context) -> Any:
            try:
                gate.authorize(gate.authenticate(context), request, context)
            except Refused as refused:
                if in_band is None:
                    await _abort(context, refused)
                await context.write(in_band(refused))  # type: ignore[misc]
                return None
            return await behaviour(request, context)

        return written

    async def wrapped(request: Any, context: Context) -> AsyncIterator[Any]:
        try:
            gate.authorize(gate.authenticate(context), request, context)
        except Refused as refused:
            if in_band is None:
                await _abort(context, refused)
            yield in_band(refused)  # type: ignore[misc]
            return
        async for response in behaviour(request, context):
            yield response

    return wrapped


class _Checked:
    """A stream's requests, each authorized as it comes. A refused one ends the reading
    (ServiceError) and is remembered: a handler that reads in a task of its own (the v2
    Telemetry) swallows that error, so the call is ended with it once the handler is done."""

    def __init__(self, requests: AsyncIterator[Any], user: User, gate: Gate, context: Context):
        self._requests = requests
        self._user = user
        self._gate = gate
        self._context = context
        self.refused: Refused | None = None

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for request in self._requests:
            try:
                self._gate.authorize(self._user, request, self._context)
            except Refused as refused:
                self.refused = refused
                raise ServiceError(refused.code, refused.message) from None
            yield request

    async def end_if_refused(self) -> None:
        if self.refused is not None:
            await self._context.abort(self.refused.code, self.refused.message)


def _stream_unary(behaviour: Any, gate: Gate) -> Any:
    async def wrapped(requests: AsyncIterator[Any], context: Context) -> Any:
        checked = _Checked(requests, await _caller(gate, context), gate, context)
        result = await behaviour(checked.__aiter__(), context)
        await checked.end_if_refused()
        return result

    return wrapped


def _stream_stream(behaviour: Any, gate: Gate) -> Any:
    if not inspect.isasyncgenfunction(behaviour):
        return _stream_unary(behaviour, gate)  # answers with context.write: same shape

    async def wrapped(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
        checked = _Checked(requests, await _caller(gate, context), gate, context)
        async for response in behaviour(checked.__aiter__(), context):
            yield response
        await checked.end_if_refused()

    return wrapped


async def _caller(gate: Gate, context: Context) -> User:
    try:
        return gate.authenticate(context)
    except Refused as refused:
        await context.abort(refused.code, refused.message)
        raise  # not reached: abort raises
