"""An idempotent Append on a real storage process (producer_id, first_sequence,
producer_epoch): the original result for a retry, and clear statuses for what it does
not take (bad id, messages instead of records, two queues, records whose __PID/__PSEQ
do not match the request, negative numbers, a gap); and several producers' batches in one
Append (producer_runs), as the gateway coalesces them; the duplicates answered and the
producers tracked as metrics."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import grpc

from tests._metrics import scrape, total
from tests.services.storage.conftest import (
    RPC_TIMEOUT_S,
    StorageLauncher,
    StorageProcess,
    expect_error,
    message,
)
from tide.format import PRODUCER_ID, PRODUCER_SEQ, RunWriter, pack_host, parse_host
from tide.v1 import storage_pb2 as pb
from tide.waiting import wait_until

HOST = pack_host(parse_host("127.0.0.1:1"))
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def run(topic: str, queues: list[int], pid: str, first: int, seqs: str | None = None) -> bytes:
    writer = RunWriter(HOST)
    text = seqs if seqs is not None else f"{first}-{first + len(queues) - 1}"
    props = f"{PRODUCER_ID}\x01{pid}\x02{PRODUCER_SEQ}\x01{text}\x02".encode()
    for queue_id in queues:
        writer.add(topic, topic.encode(), queue_id, b"body", props, 0, 0, 1)
    return writer.getvalue()


def append(storage: StorageProcess, **fields: object) -> pb.AppendResponse:
    return storage.stub.Append(pb.AppendRequest(**fields), timeout=RPC_TIMEOUT_S)  # type: ignore[arg-type]


def test_a_retry_gets_the_original_columns(shared_storage: StorageProcess, topic_name: str) -> None:
    records = [run(topic_name, [1, 1], "p1", 0)]
    first = append(shared_storage, records=records, producer_id="p1")
    again = append(shared_storage, records=records, producer_id="p1")
    assert not first.duplicate and again.duplicate
    assert list(again.physical_offsets) == list(first.physical_offsets)
    assert list(again.queue_offsets) == list(first.queue_offsets) == [0, 1]
    assert again.store_timestamp_ms == first.store_timestamp_ms
    nxt = append(
        shared_storage, records=[run(topic_name, [1], "p1", 2)], producer_id="p1", first_sequence=2
    )
    assert list(nxt.queue_offsets) == [2]


def test_what_an_idempotent_append_does_not_take(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    ok = [run(topic_name, [0], "p2", 0)]
    cases: list[tuple[grpc.StatusCode, dict[str, object], str]] = [
        (INVALID, {"records": ok, "producer_id": "p 2"}, "letters, digits"),
        (INVALID, {"messages": [message(topic_name)], "producer_id": "p2"}, "carries records"),
        (
            INVALID,
            {"records": [run(topic_name, [0, 1], "p2", 0)], "producer_id": "p2"},
            "one queue",
        ),
        (INVALID, {"records": ok, "producer_id": "other"}, "__PID property"),
        (
            INVALID,
            {"records": [run(topic_name, [0], "p2", 0, "0-5")], "producer_id": "p2"},
            "__PSEQ",
        ),
        (INVALID, {"records": ok, "producer_id": "p2", "first_sequence": -1}, "negative"),
        (INVALID, {"records": ok, "producer_id": "p2", "producer_epoch": -1}, "negative"),
    ]
    for code, fields, fragment in cases:
        expect_error(code, partial(append, shared_storage, **fields), fragment)
    append(shared_storage, records=ok, producer_id="p2")
    gap = [run(topic_name, [0], "p2", 3)]
    expect_error(
        grpc.StatusCode.OUT_OF_RANGE,
        lambda: append(shared_storage, records=gap, producer_id="p2", first_sequence=3),
        "next expected is 1",
    )


# -- producer_runs: several producers' batches in one Append (the gateway coalesces) --
def runs(*batches: tuple[str, int, int]) -> list[pb.ProducerRun]:
    return [pb.ProducerRun(producer_id=pid, first_sequence=first) for pid, _, first in batches]


def test_batches_of_several_producers_go_in_one_append(
    shared_storage: StorageProcess, topic_name: str
) -> None:
    a, b = run(topic_name, [0, 0], "ra", 0), run(topic_name, [1], "rb", 5)
    both = append(shared_storage, records=[a, b], producer_runs=runs(("ra", 0, 0), ("rb", 1, 5)))
    assert not both.duplicate and list(both.queue_offsets) == [0, 1, 0]
    # Each batch is in its producer's window: alone, a retry gets its own columns.
    again = append(shared_storage, records=[b], producer_runs=runs(("rb", 1, 5)))
    assert again.duplicate and list(again.physical_offsets) == list(both.physical_offsets[2:])
    # A retry among coalesced batches: nothing written, ABORTED (the gateway sends alone).
    c = run(topic_name, [0], "ra", 2)
    expect_error(
        grpc.StatusCode.ABORTED,
        lambda: append(
            shared_storage, records=[c, b], producer_runs=runs(("ra", 0, 2), ("rb", 1, 5))
        ),
        "send the batches alone",
    )
    nxt = append(shared_storage, records=[c], producer_runs=runs(("ra", 0, 2)))
    assert not nxt.duplicate and list(nxt.queue_offsets) == [2]  # c was not written before


def test_what_producer_runs_do_not_take(shared_storage: StorageProcess, topic_name: str) -> None:
    a, b = run(topic_name, [0], "rc", 0), run(topic_name, [1], "rd", 0)
    two = runs(("rc", 0, 0), ("rd", 1, 0))
    cases: list[tuple[grpc.StatusCode, dict[str, object], str]] = [
        (INVALID, {"records": [a], "producer_runs": two}, "2 producer_runs for 1 records"),
        (INVALID, {"records": [a, b], "producer_runs": two, "producer_id": "rc"}, "not with"),
        (
            INVALID,
            {"records": [a, b], "producer_runs": runs(("rc", 0, 0), ("r d", 1, 0))},
            "producer_runs[1].producer_id",
        ),
        (
            INVALID,
            {"records": [a, b], "producer_runs": runs(("rc", 0, 0), ("rc", 1, 0))},
            "__PID property",
        ),
        (
            INVALID,
            {"records": [a + b, b], "producer_runs": two},
            "one queue",
        ),
        (
            grpc.StatusCode.ABORTED,
            {
                "records": [a, run(topic_name, [0], "rc", 1)],
                "producer_runs": runs(("rc", 0, 0), ("rc", 0, 1)),
            },
            "two batches of producer rc for one queue",
        ),
    ]
    for code, fields, fragment in cases:
        expect_error(code, partial(append, shared_storage, **fields), fragment)
    # Nothing of the refused appends was written: both producers start at 0.
    ok = append(shared_storage, records=[a, b], producer_runs=two)
    assert list(ok.queue_offsets) == [0, 0]


def test_duplicates_answered_and_producers_tracked_are_metrics(
    launcher: StorageLauncher, tmp_path: Path
) -> None:
    storage = launcher.start(tmp_path / "store", "--metrics-listen", "127.0.0.1:0")

    def metric(name: str) -> float:
        return total(scrape(str(storage.ready["metrics"])), name)

    topic = "MetricsTopic"
    first = [run(topic, [0], "m1", 0)]
    append(storage, records=first, producer_id="m1")
    append(storage, records=[run(topic, [0], "m2", 0)], producer_id="m2")
    assert append(storage, records=first, producer_id="m1").duplicate
    assert append(storage, records=first, producer_id="m1").duplicate
    wait_until(
        lambda: metric("tide_storage_idempotent_duplicates_total") == 2,
        "two duplicates answered",
    )
    wait_until(lambda: metric("tide_storage_idempotent_producers") == 2, "two producers tracked")
