"""``ProduceRequest.compact_results``: the runs (produce_results.py) hold what the
per-message results would, through a real gateway in front of two real brokers (each
message found where its run says, with that msg id and unique key), and the rules that
cut runs, unit by unit."""

from __future__ import annotations

import grpc
import pytest

from services.gateway.produce_results import Written, appended_response, runs_response
from tests._cluster import Cluster
from tests.services.gateway.conftest import RPC_TIMEOUT_S
from tide.format import UNIQ_KEY
from tide.server import ServiceError
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb

OK = pb.ProduceResult.SEND_OK
FAILED = pb.ProduceResult.SEND_FAILED
# One expanded run entry: (status, broker, queue id, queue offset, msg id, unique key).
Expanded = tuple[int, str, int, int, str, str]


def expand(response: pb.ProduceResponse, count: int) -> list[Expanded]:
    """Each message's facts from the runs, checking they cover 0..count-1 in order."""
    out: list[Expanded] = []
    assert not response.results
    for run in response.runs:
        assert run.first_index == len(out) and run.count == len(run.unique_keys) > 0
        for i, unique_key in enumerate(run.unique_keys):
            if run.status == FAILED:
                out.append((run.status, "", 0, 0, "", unique_key))
                continue
            msg_id = f"{run.msg_id_prefix}{run.physical_offsets[i]:016X}"
            out.append(
                (run.status, run.broker_name, run.queue_id, run.first_queue_offset + i, msg_id,
                 unique_key)
            )  # fmt: skip
    assert len(out) == count
    return out


def check_stored(
    cluster: Cluster, messages: list[pb.ProduceMessage], facts: list[Expanded]
) -> None:
    """Every message is where its run says, with its msg id and unique key."""
    stub = cluster.gateway.stub
    for message, (status, broker, queue_id, offset, msg_id, unique_key) in zip(
        messages, facts, strict=True
    ):
        assert status == OK
        # Held until the dispatch has it: the produce's answer comes from the storage.
        request = pb.PullRequest(
            topic=message.topic, broker_name=broker, queue_id=queue_id, offset=offset,
            max_messages=1, long_poll_timeout_ms=10_000,
        )  # fmt: skip
        (stored,) = stub.Pull(request, timeout=RPC_TIMEOUT_S).messages
        assert (stored.body, stored.queue_offset, stored.msg_id) == (message.body, offset, msg_id)
        assert stored.properties[UNIQ_KEY] == unique_key


def test_a_plain_batch_is_one_run(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=2)
    stub = cluster.gateway.stub
    for _ in range(3):  # successive requests take successive queues
        messages = [pb.ProduceMessage(topic=topic_name, body=f"m{i}".encode()) for i in range(40)]
        request = pb.ProduceRequest(messages=messages, compact_results=True)
        response = stub.Produce(request, timeout=RPC_TIMEOUT_S)
        assert len(response.runs) == 1
        check_stored(cluster, messages, expand(response, len(messages)))


def test_the_general_path_and_the_stream_answer_runs(cluster: Cluster, topic_name: str) -> None:
    """Two topics, tags, an explicit queue: a run per queue, in the request's order."""
    other = f"{topic_name}_2"
    cluster.create_topic(topic_name, queues=2)
    cluster.create_topic(other, queues=2)
    messages = [
        pb.ProduceMessage(topic=topic_name, body=b"a0", tags="T"),
        pb.ProduceMessage(topic=topic_name, body=b"a1", keys=["k"]),
        pb.ProduceMessage(topic=other, body=b"b0"),
        pb.ProduceMessage(topic=topic_name, body=b"x", queue=pb.QueueRef(broker_name="broker-b")),
        pb.ProduceMessage(topic=other, body=b"b1", unique_key="MY_KEY"),
    ]
    request = pb.ProduceRequest(messages=messages, compact_results=True)
    response = cluster.gateway.stub.Produce(request, timeout=RPC_TIMEOUT_S)
    facts = expand(response, len(messages))
    assert len(response.runs) >= 3  # the topics' queues and the explicit one interleave
    assert facts[4][5] == "MY_KEY"
    check_stored(cluster, messages, facts)
    (answer,) = cluster.gateway.stub.ProduceStream(iter([request]), timeout=RPC_TIMEOUT_S)
    check_stored(cluster, messages, expand(answer.response, len(messages)))


# -- the runs, unit by unit ------------------------------------------------------------
def row(queue_id: int, offset: int, physical: int, **changes: object) -> Written:
    fields: dict[str, object] = {
        "broker": "broker-a", "status": OK, "prefix": "7F0000010000271F", "stored_ms": 5,
    }  # fmt: skip
    fields.update(changes)
    return (
        str(fields["broker"]), queue_id, fields["status"],  # type: ignore[return-value]
        f"{fields['prefix']}{physical:016X}", offset, fields["stored_ms"],
    )  # fmt: skip


def test_runs_are_cut_where_a_fact_changes() -> None:
    boom = ServiceError(grpc.StatusCode.UNAVAILABLE, "down")
    rows: list[Written | None] = [
        row(1, 10, 100), row(1, 11, 250),  # one run
        row(1, 13, 400),  # a gap in queue offsets
        row(2, 14, 500),  # another queue
        row(2, 15, 600, stored_ms=6),  # another store time
        row(2, 16, 700, prefix="0A00000100002A9F"),  # another host
        row(2, 17, 800, status=pb.ProduceResult.FLUSH_DISK_TIMEOUT),
        None, None,  # failed alike: one run
        row(2, 18, 900, broker="broker-b"),
    ]  # fmt: skip
    errors: list[ServiceError | None] = [boom if r is None else None for r in rows]
    keys = [f"U{i}" for i in range(len(rows))]
    response = runs_response(keys, rows, errors)
    assert [(run.first_index, run.count) for run in response.runs] == [
        (0, 2), (2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 2), (9, 1),
    ]  # fmt: skip
    first = response.runs[0]
    assert list(first.physical_offsets) == [100, 250] and list(first.unique_keys) == ["U0", "U1"]
    assert (first.first_queue_offset, first.msg_id_prefix) == (10, "7F0000010000271F")
    failed = response.runs[6]
    assert failed.status == FAILED and failed.error == "UNAVAILABLE: down"
    assert not failed.physical_offsets and list(failed.unique_keys) == ["U7", "U8"]
    with pytest.raises(ServiceError, match="down"):  # nothing written: the call fails
        runs_response(["U"], [None], [boom])


def test_an_appended_batch_is_sliced_from_the_append_answer() -> None:
    answer = storage_pb.AppendResponse(
        status=storage_pb.FLUSH_DISK_TIMEOUT,
        msg_id_prefix="7F0000010000271F",
        physical_offsets=[1, 2, 30, 40, 50],
        queue_offsets=[9, 9, 7, 8, 9],
        store_timestamp_ms=77,
    )
    response = appended_response(["a", "b", "c"], ("broker-a", 3, answer, 2))
    (run,) = response.runs
    assert (run.first_index, run.count, run.status) == (0, 3, pb.ProduceResult.FLUSH_DISK_TIMEOUT)
    assert (run.broker_name, run.queue_id, run.first_queue_offset) == ("broker-a", 3, 7)
    assert list(run.physical_offsets) == [30, 40, 50]
    assert list(run.unique_keys) == ["a", "b", "c"]
    assert run.store_timestamp_ms == 77
