"""A produce's outcome per message, and the response built from them: a ProduceResult
per message, or with ``compact_results`` a ProduceRun per run of messages."""

from __future__ import annotations

from collections.abc import Sequence

from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

STATUS: dict[storage_pb.AppendStatus.ValueType, pb.ProduceResult.Status.ValueType] = {
    storage_pb.PUT_OK: pb.ProduceResult.SEND_OK,
    storage_pb.FLUSH_DISK_TIMEOUT: pb.ProduceResult.FLUSH_DISK_TIMEOUT,
    storage_pb.FLUSH_SLAVE_TIMEOUT: pb.ProduceResult.FLUSH_SLAVE_TIMEOUT,
    storage_pb.SLAVE_NOT_AVAILABLE: pb.ProduceResult.SLAVE_NOT_AVAILABLE,
}
# A written message: (broker name, queue id, status, msg id, queue offset, store time).
Written = tuple[str, int, pb.ProduceResult.Status.ValueType, str, int, int]


def written_rows(
    broker_name: str, queue_ids: Sequence[int], response: storage_pb.AppendResponse, start: int
) -> list[Written]:
    """The rows of the records ``start..start + len(queue_ids)`` of a ``records`` Append
    (the caller checked the response holds them)."""
    end = start + len(queue_ids)
    status = STATUS[response.status]
    prefix = response.msg_id_prefix
    stored_ms = response.store_timestamp_ms
    # make_msg_id inline: the prefix, then the offset as 16 upper-case hex digits.
    return [
        (broker_name, queue_id, status, f"{prefix}{physical:016X}", queue_offset, stored_ms)
        for queue_id, physical, queue_offset in zip(
            queue_ids,
            response.physical_offsets[start:end],
            response.queue_offsets[start:end],
            strict=True,
        )
    ]


def produce_response(
    unique_keys: Sequence[str],
    rows: Sequence[Written | None],
    errors: Sequence[ServiceError | None],
) -> pb.ProduceResponse:
    """Every message written -> their results; none -> the first error is raised; some
    -> the others are SEND_FAILED with their error."""
    if all(row is None for row in rows):
        first = next(error for error in errors if error is not None)
        raise first
    response = pb.ProduceResponse()
    add = response.results.add
    for unique_key, row, error in zip(unique_keys, rows, errors, strict=True):
        if row is not None:
            broker_name, queue_id, status, msg_id, queue_offset, stored_ms = row
            add(
                status=status,
                msg_id=msg_id,
                unique_key=unique_key,
                broker_name=broker_name,
                queue_id=queue_id,
                queue_offset=queue_offset,
                store_timestamp_ms=stored_ms,
            )
        else:
            assert error is not None
            add(
                status=pb.ProduceResult.SEND_FAILED,
                unique_key=unique_key,
                error=f"{error.code.name}: {error.message}",
            )
    return response


# A batch written by one append: (broker name, queue id, the Append's response, where
# its records start in that response).
Appended = tuple[str, int, storage_pb.AppendResponse, int]
_OFFSET_HEX_DIGITS = 16  # a msg id ends with the physical offset in these


def appended_response(unique_keys: Sequence[str], appended: Appended) -> pb.ProduceResponse:
    """The compact response of a request whose messages all went to one queue in one
    append: a single run, its columns sliced from the Append's response. Built in place
    (a run made apart and put into the response is copied, keys and all), the offsets
    copied as a whole when the append carried only this request."""
    broker_name, queue_id, response, start = appended
    count = len(unique_keys)
    end = start + count
    queue_offsets = response.queue_offsets
    first_queue_offset = queue_offsets[start]
    assert queue_offsets[end - 1] == first_queue_offset + count - 1, "one queue, in order"
    physical_offsets = response.physical_offsets
    answer = pb.ProduceResponse()
    run = answer.runs.add(
        first_index=0,
        count=count,
        status=STATUS[response.status],
        broker_name=broker_name,
        queue_id=queue_id,
        first_queue_offset=first_queue_offset,
        msg_id_prefix=response.msg_id_prefix,
        store_timestamp_ms=response.store_timestamp_ms,
    )
    whole = start == 0 and end == len(physical_offsets)
    run.physical_offsets.extend(physical_offsets if whole else physical_offsets[start:end])
    run.unique_keys.extend(unique_keys)
    return answer


def runs_response(
    unique_keys: Sequence[str],
    rows: Sequence[Written | None],
    errors: Sequence[ServiceError | None],
) -> pb.ProduceResponse:
    """:func:`produce_response`'s facts as runs: consecutive messages written to one queue
    with one status, store time and msg id prefix at consecutive queue offsets, or not
    written with one error, share a run."""
    if all(row is None for row in rows):
        raise next(error for error in errors if error is not None)
    response = pb.ProduceResponse()
    run: pb.ProduceRun | None = None
    shape: tuple[object, ...] = ()
    for index, (unique_key, row, error) in enumerate(zip(unique_keys, rows, errors, strict=True)):
        if row is not None:
            broker_name, queue_id, status, msg_id, queue_offset, stored_ms = row
            prefix, physical = msg_id[:-_OFFSET_HEX_DIGITS], msg_id[-_OFFSET_HEX_DIGITS:]
            key: tuple[object, ...] = (broker_name, queue_id, status, prefix, stored_ms)
            if run is None or key != shape or queue_offset != run.first_queue_offset + run.count:
                run = response.runs.add(
                    first_index=index,
                    status=status,
                    broker_name=broker_name,
                    queue_id=queue_id,
                    first_queue_offset=queue_offset,
                    msg_id_prefix=prefix,
                    store_timestamp_ms=stored_ms,
                )
                shape = key
            run.physical_offsets.append(int(physical, 16))
        else:
            assert error is not None
            text = f"{error.code.name}: {error.message}"
            if run is None or shape != (text,):
                run = response.runs.add(
                    first_index=index, status=pb.ProduceResult.SEND_FAILED, error=text
                )
                shape = (text,)
        run.unique_keys.append(unique_key)
        run.count += 1
    return response
