"""Read's ``positions`` form: one decoded StoredMessage per (physical offset, size).

What the gateway's message pulls, POP's reads and queries ask for. The records read
whole are decoded together, by one call of tide.format's record reader
(``convert.stored_messages_fields``: ``v4_record_fields``, compiled when built); a record
that reader does not take (IPv6 hosts, a two-byte topic length, damage), a position
without a size and one that does not read whole go through the general decoder, which
gives each its status.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias

import grpc

from services.storage import convert
from services.storage.engine.commitlog import CommitLog, OffsetBelowMinError
from tide.format import RecordError
from tide.server import ServiceError
from tide.stored import stored_message
from tide.v1 import storage_pb2 as pb

# A position's answer: its ReadResult, or the record's bytes and offset (read whole).
Answer: TypeAlias = pb.ReadResult | tuple[bytes, int]


def read_positions(
    commitlog: CommitLog,
    positions: Sequence[pb.ReadRequest.Position],
    hosts: dict[bytes, str],
    sized_bytes: int,
    max_bytes: int,
) -> pb.ReadResponse:
    """The ReadResponse of ``positions`` (checked for count and ``sized_bytes``, the sum
    of their sizes, by the caller); raises ServiceError for a negative offset or size,
    or when the records sized by themselves take the bytes past ``max_bytes``.
    ``hosts`` caches packed host -> ``ip:port`` text."""
    total = sized_bytes
    answers: list[Answer] = []
    for index, pos in enumerate(positions):
        offset, size = pos.physical_offset, pos.size
        if offset < 0 or size < 0:
            raise ServiceError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"positions[{index}]: physical_offset and size must be >= 0 (got {offset}, {size})",
            )
        if size:  # the common read: the record's bytes, decoded below with the others
            try:
                _, data = commitlog.read_raw(offset, size)
            except OffsetBelowMinError:
                data = b""
            if len(data) == size:
                answers.append((data, offset))
                continue
        result = read_one(commitlog, offset, size)  # anything else: the general path
        if size == 0:  # sized by the record itself: count what it really is
            total += result.message.size
            if total > max_bytes:
                raise ServiceError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"Read returns over {max_bytes} bytes; at most that per call: split it",
                )
        answers.append(result)
    return _response(commitlog, answers, hosts)


def _response(
    commitlog: CommitLog, answers: list[Answer], hosts: dict[bytes, str]
) -> pb.ReadResponse:
    """The records read whole decoded in one call when every one is a common record,
    else one by one, through the general path where that fails too."""
    response = pb.ReadResponse()
    add = response.results.add
    read = [answer for answer in answers if isinstance(answer, tuple)]
    together = convert.stored_messages_fields(
        b"".join([data for data, _ in read]), [offset for _, offset in read], hosts
    )
    decoded: Iterator[dict[str, Any] | None] = iter(
        together
        if together is not None
        else [convert.stored_message_fields(data, offset, hosts) for data, offset in read]
    )
    for answer in answers:
        if not isinstance(answer, tuple):
            response.results.append(answer)
            continue
        fields = next(decoded)
        if fields is not None:
            add(status=pb.FOUND, message=fields)
        else:
            response.results.append(read_one(commitlog, answer[1], len(answer[0])))
    return response


def read_one(commitlog: CommitLog, offset: int, size: int) -> pb.ReadResult:
    """The record at ``offset`` (``size`` 0: sized by itself) through the general
    decoder, or the status that says why there is none."""
    try:
        record = commitlog.read_record(offset, size)
    except OffsetBelowMinError:
        return pb.ReadResult(status=pb.OFFSET_BELOW_MIN)
    except IndexError:
        return pb.ReadResult(status=pb.OFFSET_ABOVE_MAX)
    except RecordError:
        return pb.ReadResult(status=pb.NOT_A_RECORD)
    return pb.ReadResult(status=pb.FOUND, message=stored_message(record))
