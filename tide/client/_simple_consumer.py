"""``SimpleConsumer``: POP consumption (RocketMQ 5's SimpleConsumer; docs/pop.md).

The brokers hand the group messages of a topic; each received message is invisible to the
group for ``invisible_duration_ms`` and must be acked within it, or it is delivered again
(attempt + 1) and, past the group's retry maximum, dead-lettered. No rebalancing, no
offsets to commit: any number of consumers of a group share the topic's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from tide.auth.client import Credentials
from tide.client._closing import Closing
from tide.client._convert import check_group, check_topic, from_stored_message
from tide.client._errors import FailedPrecondition, InvalidArgument, TideError, Unavailable
from tide.client._rpc import (
    DEFAULT_GATEWAY,
    DEFAULT_RPC_TIMEOUT_MS,
    ClientTls,
    Connection,
    RetryPolicy,
)
from tide.client._types import ReceivedMessage
from tide.limits import (
    ACK_ENTRIES_MAX_COUNT,
    POP_INVISIBLE_MAX_MS,
    POP_INVISIBLE_MIN_MS,
    PULL_MAX_MESSAGES,
)
from tide.v1 import gateway_pb2

DEFAULT_INVISIBLE_DURATION_MS = 30_000
DEFAULT_AWAIT_DURATION_MS = 20_000  # a Receive with nothing waits this long (long poll)
MAX_AWAIT_DURATION_MS = 30_000  # the gateway's default --max-long-poll-ms
_ERRORS: dict[int, type[TideError]] = {
    gateway_pb2.POP_ERROR_INVALID_RECEIPT_HANDLE: InvalidArgument,
    gateway_pb2.POP_ERROR_RECEIPT_HANDLE_EXPIRED: FailedPrecondition,
    gateway_pb2.POP_ERROR_UNAVAILABLE: Unavailable,
}


@dataclass(frozen=True)
class PopMessage:
    """A received message and what acks it (RocketMQ 5's MessageView)."""

    message: ReceivedMessage
    receipt_handle: str
    # 1 on the first delivery, + 1 on each redelivery.
    delivery_attempt: int
    # When it is delivered again unless acked (ms since epoch).
    invisible_until_ms: int

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def msg_id(self) -> str:
        return self.message.msg_id


@dataclass(frozen=True)
class GroupLag:
    ready: int
    inflight: int
    delayed: int
    queues: tuple[gateway_pb2.QueueLag, ...]


class SimpleConsumer(Closing):
    def __init__(
        self,
        group: str,
        topic: str,
        expression: str = "*",
        gateway: str = DEFAULT_GATEWAY,
        *,
        await_duration_ms: int = DEFAULT_AWAIT_DURATION_MS,
        rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS,
        retry: RetryPolicy | None = None,
        tls: ClientTls = False,
        credentials: Credentials | None = None,
    ) -> None:
        check_group(group)
        check_topic(topic)
        if not 0 <= await_duration_ms <= MAX_AWAIT_DURATION_MS:
            raise InvalidArgument(
                f"await_duration_ms is {await_duration_ms}; give 0..{MAX_AWAIT_DURATION_MS}"
            )
        self.group, self.topic, self.expression = group, topic, expression
        self._await_ms = await_duration_ms
        self._connection = Connection(
            gateway,
            rpc_timeout_ms=rpc_timeout_ms,
            retry=retry,
            tls=tls,
            credentials=credentials,
        )

    def close(self) -> None:
        self._connection.close()

    def receive(
        self, max_messages: int = 16, invisible_duration_ms: int = DEFAULT_INVISIBLE_DURATION_MS
    ) -> list[PopMessage]:
        """Up to ``max_messages``, waiting up to the await duration when none is ready
        (an empty list then)."""
        if not 1 <= max_messages <= PULL_MAX_MESSAGES:
            raise InvalidArgument(f"max_messages is {max_messages}; give 1..{PULL_MAX_MESSAGES}")
        if not POP_INVISIBLE_MIN_MS <= invisible_duration_ms <= POP_INVISIBLE_MAX_MS:
            raise InvalidArgument(
                f"invisible_duration_ms is {invisible_duration_ms}; give "
                f"{POP_INVISIBLE_MIN_MS}..{POP_INVISIBLE_MAX_MS} (10 s .. 12 h)"
            )
        request = gateway_pb2.ReceiveRequest(
            consumer_group=self.group,
            topic=self.topic,
            expression=self.expression,
            max_messages=max_messages,
            invisible_duration_ms=invisible_duration_ms,
            long_poll_timeout_ms=self._await_ms,
        )
        response = self._connection.call(
            self._connection.stub.Receive,
            request,
            f"Receive from {self.topic!r} for group {self.group!r}",
            extra_timeout_ms=self._await_ms,
        )
        return [_pop_message(m) for m in response.messages]

    def ack(self, message: PopMessage) -> None:
        """Raise InvalidArgument (not this group's, or acked / delivered again already),
        FailedPrecondition (its invisible time passed) or Unavailable."""
        error = self.ack_many([message])[0]
        if error is not None:
            raise error

    def ack_many(self, messages: Sequence[PopMessage]) -> list[TideError | None]:
        """Ack each message (in calls of at most ACK_ENTRIES_MAX_COUNT); per message its
        error, or None when acked."""
        errors: list[TideError | None] = []
        for start in range(0, len(messages), ACK_ENTRIES_MAX_COUNT):
            part = messages[start : start + ACK_ENTRIES_MAX_COUNT]
            request = gateway_pb2.AckRequest(
                consumer_group=self.group,
                topic=self.topic,
                entries=[gateway_pb2.AckEntry(receipt_handle=m.receipt_handle) for m in part],
            )
            response = self._connection.call(
                self._connection.stub.Ack, request, f"Ack of {len(part)} messages"
            )
            for result in response.results:
                kind = _ERRORS.get(result.error)
                errors.append(None if kind is None else kind(result.error_message))
        return errors

    def change_invisible_duration(self, message: PopMessage, duration_ms: int) -> PopMessage:
        """The message invisible for ``duration_ms`` from now (0 .. 12 h); answers it with
        its new receipt handle (the old one is spent)."""
        if not 0 <= duration_ms <= POP_INVISIBLE_MAX_MS:
            raise InvalidArgument(f"duration_ms is {duration_ms}; give 0..{POP_INVISIBLE_MAX_MS}")
        request = gateway_pb2.ChangeInvisibleDurationRequest(
            consumer_group=self.group,
            topic=self.topic,
            receipt_handle=message.receipt_handle,
            invisible_duration_ms=duration_ms,
        )
        response = self._connection.call(
            self._connection.stub.ChangeInvisibleDuration,
            request,
            f"ChangeInvisibleDuration of {message.msg_id}",
        )
        return replace(
            message,
            receipt_handle=response.receipt_handle,
            invisible_until_ms=response.invisible_until_ms,
        )

    def forward_to_dead_letter(self, message: PopMessage) -> str:
        """Store the message in %DLQ%<group> now (and ack it); answers the dead letter's
        msg id."""
        request = gateway_pb2.ForwardToDeadLetterRequest(
            consumer_group=self.group, topic=self.topic, receipt_handle=message.receipt_handle
        )
        response = self._connection.call(
            self._connection.stub.ForwardToDeadLetter,
            request,
            f"ForwardToDeadLetter of {message.msg_id}",
        )
        return response.msg_id

    def lag(self) -> GroupLag:
        """The group's lag on the topic (ready, in flight, waiting to come again)."""
        response = self._connection.call(
            self._connection.stub.GetGroupLag,
            gateway_pb2.GetGroupLagRequest(consumer_group=self.group, topic=self.topic),
            f"GetGroupLag of {self.group!r} on {self.topic!r}",
        )
        return GroupLag(response.ready, response.inflight, response.delayed, tuple(response.queues))


def _pop_message(received: gateway_pb2.ReceivedMessage) -> PopMessage:
    return PopMessage(
        message=from_stored_message(received.broker_name, received.message),
        receipt_handle=received.receipt_handle,
        delivery_attempt=received.delivery_attempt,
        invisible_until_ms=received.invisible_until_ms,
    )
