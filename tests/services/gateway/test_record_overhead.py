"""RECORD_OVERHEAD_MAX_BYTES bounds what a produced message grows by on its way to the
storage (request -> the gateway's record run in an Append), so APPEND_MAX_BYTES, the
storage's receive limit, holds the records of any Produce within PRODUCE_MAX_BYTES."""

from __future__ import annotations

import pytest

from services.gateway.append_queue import MAX_COALESCED_BYTES
from services.gateway.records import add_message
from services.gateway.uniq import UniqueKeyGenerator
from tide.format import HostAddress, RunWriter, pack_host
from tide.limits import (
    APPEND_MAX_BYTES,
    PRODUCE_MAX_BYTES,
    PRODUCE_MESSAGES_MAX,
    RECORD_OVERHEAD_MAX_BYTES,
)
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

IPV6_HOST = pack_host(HostAddress("2001:db8::1", 65535))

# The messages that grow the most: little of their own, everything the gateway adds.
SMALLEST = [
    pb.ProduceMessage(topic="T"),
    pb.ProduceMessage(topic="T", tags="a"),
    pb.ProduceMessage(topic="T", tags="a", keys=["k"]),
    pb.ProduceMessage(topic="T", tags="a", keys=["k", "l"], flag=1),
    pb.ProduceMessage(topic="T", unique_key="u" * 128, tags="a", keys=["k"]),
    pb.ProduceMessage(topic="T", body=b"b", properties={"p": ""}, tags="a", keys=["k"]),
]


def growth_bytes(message: pb.ProduceMessage, count: int) -> int:
    """How much larger ``count`` copies of ``message`` are as the gateway's Append (an
    IPv6 producer: the larger record header) than as a Produce request."""
    request = pb.ProduceRequest(messages=[message] * count)
    writer = RunWriter(IPV6_HOST)
    for unique_key in UniqueKeyGenerator().next_many(count):
        add_message(writer, message, 0, message.unique_key or unique_key, 0)
    append = storage_pb.AppendRequest(records=[writer.getvalue()])
    return append.ByteSize() - request.ByteSize()


@pytest.mark.parametrize("message", SMALLEST, ids=range(len(SMALLEST)))
@pytest.mark.parametrize("count", [1, 1_000])
def test_a_message_grows_by_at_most_the_record_overhead(
    message: pb.ProduceMessage, count: int
) -> None:
    assert growth_bytes(message, count) <= count * RECORD_OVERHEAD_MAX_BYTES


def test_the_record_overhead_bound_is_not_loose() -> None:
    """It sizes the storage's receive limit: the worst message comes near it."""
    worst = max(growth_bytes(message, 1) for message in SMALLEST)
    assert worst > RECORD_OVERHEAD_MAX_BYTES * 3 // 4


def test_the_append_limit_holds_the_largest_produce_and_any_coalesced_append() -> None:
    assert APPEND_MAX_BYTES == PRODUCE_MAX_BYTES + PRODUCE_MESSAGES_MAX * RECORD_OVERHEAD_MAX_BYTES
    # Appends coalesced from several produces stop at MAX_COALESCED_BYTES (one produce's
    # records alone may be more, up to APPEND_MAX_BYTES).
    assert MAX_COALESCED_BYTES < APPEND_MAX_BYTES
