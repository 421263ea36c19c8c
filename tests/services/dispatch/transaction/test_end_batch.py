"""EndTransactions of one broker resolved in batches (transaction/batch.py): concurrent
duplicates resolve each half once, write nothing twice, and refuse the later ones with
FAILED_PRECONDITION; the run of a batch keeps each ending's records in place."""

from __future__ import annotations

from collections import Counter

import grpc

from services.dispatch.transaction.batch import Ending, EndRun
from tests._cluster import Cluster, cluster_fixture
from tide.client import Admin, Message, Producer, TransactionOutcome, TransactionResolution
from tide.format import (
    RESOLUTION_COMMIT,
    RESOLUTION_ROLLBACK,
    TRANS_OP_HALF_TOPIC,
    decode_record,
    encode_properties,
    encode_record,
    half_properties,
)
from tide.v1 import dispatch_pb2
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until

HALVES = 40
COPIES = 3  # EndTransactions of each half, all in flight at once

batch_cluster = cluster_fixture(name="batch_cluster", brokers=1)


def end_request(outcome: TransactionOutcome, group: str, index: int) -> pb.EndTransactionRequest:
    half = outcome.half
    return pb.EndTransactionRequest(
        producer_group=group,
        broker_name=half.queue.broker_name,
        msg_id=half.msg_id,
        queue_offset=half.queue_offset,
        transaction_id=outcome.transaction_id,
        # Half of the halves commit, the others roll back.
        resolution=pb.COMMIT if index % 2 == 0 else pb.ROLLBACK,
    )


def test_concurrent_duplicate_end_transactions_resolve_each_half_once(
    batch_cluster: Cluster,
) -> None:
    topic, group = "T_tx_batch", "PG_batch"
    gateway = batch_cluster.gateway
    with Admin(gateway.listen) as admin, Producer(gateway.listen, producer_group=group) as producer:
        admin.create_topic(topic, read_queue_nums=2, message_type="TRANSACTION")
        outcomes = [
            producer.send_transaction(
                Message(topic, f"tx-{index}"), lambda m, h: TransactionResolution.UNKNOWN
            )
            for index in range(HALVES)
        ]
        # A half's copies one after the other: they arrive in one batch (the later ones
        # wait for the next, which refuses them) or in consecutive ones.
        requests = [
            (index, end_request(outcome, group, index))
            for index, outcome in enumerate(outcomes)
            for _ in range(COPIES)
        ]
        calls = [
            (index, gateway.stub.EndTransaction.future(request, timeout=60))
            for index, request in requests
        ]
        won: Counter[int] = Counter()
        for index, call in calls:
            try:
                answer = call.result()
            except grpc.RpcError as exc:
                assert exc.code() is grpc.StatusCode.FAILED_PRECONDITION, exc.details()
                assert "resolved already" in str(exc.details())
                continue
            won[index] += 1
            if index % 2 == 0:  # a commit answers with its copy, in the half's real queue
                assert answer.committed.queue_offset >= 0
                assert answer.committed.queue_id == outcomes[index].half.queue.queue_id
        assert won == Counter(range(HALVES))  # each half resolved by exactly one call

        assert not admin.list_transactions(group)
        # Exactly one op record per half, one copy per committed half, none rolled back.
        batch_cluster.wait_dispatched(TRANS_OP_HALF_TOPIC, HALVES)
        assert batch_cluster.queue_max(TRANS_OP_HALF_TOPIC) == HALVES
        keys = [outcome.half.unique_key for outcome in outcomes]
        committed, rolled_back = keys[0::2], keys[1::2]
        wait_until(
            lambda: all(admin.query_unique_key(topic, key) for key in committed),
            "the committed copies",
        )
        assert all(len(admin.query_unique_key(topic, key)) == 1 for key in committed)
        assert not any(admin.query_unique_key(topic, key) for key in rolled_back)


def half_record(topic: str, queue_id: int) -> bytes:
    properties = half_properties({"UNIQ_KEY": "K"}, topic, queue_id, "PG", "tx")
    return encode_record(
        "RMQ_SYS_TRANS_HALF_TOPIC",
        b"RMQ_SYS_TRANS_HALF_TOPIC",
        0,
        b"body",
        encode_properties(properties),
        0,
        0,
        1,
        bytes(8),
        bytes(8),
        0,
        0,
    ).data


def test_a_run_holds_each_ending_s_records_in_order() -> None:
    run = EndRun()
    endings = []
    for offset, commit in ((5, True), (6, False), (7, True)):
        request = dispatch_pb2.DispatchEndTransactionRequest(
            producer_group="PG", queue_offset=offset, transaction_id="tx", commit=commit
        )
        ending = Ending(request, None)  # type: ignore[arg-type]  # never answered here
        raw = half_record("T", 1)
        run.add(ending, decode_record(raw, 0, len(raw)), 1000 + offset)
        endings.append(ending)
    assert run.count == 5  # copy + op, op, copy + op
    placed = [(r.ending.offset, r.resolution, r.first_index, r.op_index) for r in run.resolved]
    assert placed == [
        (5, RESOLUTION_COMMIT, 0, 1),
        (6, RESOLUTION_ROLLBACK, 2, 2),
        (7, RESOLUTION_COMMIT, 3, 4),
    ]
    data = run.data()
    position, topics = 0, []
    while position < len(data):
        record = decode_record(data, position, len(data))
        topics.append(record.topic)
        position += record.total_size
    assert topics == ["T", TRANS_OP_HALF_TOPIC, TRANS_OP_HALF_TOPIC, "T", TRANS_OP_HALF_TOPIC]


def commit_one(producer: Producer, topic: str, body: str) -> TransactionOutcome:
    return producer.send_transaction(
        Message(topic, body), lambda m, h: TransactionResolution.COMMIT
    )


def test_resolutions_go_on_after_the_storage_restarts(batch_cluster: Cluster) -> None:
    """The service appends over one AppendStream (storage_io.py): a storage SIGKILLed
    and started again ends it, and the next resolution opens another."""
    topic, group = "T_tx_restart", "PG_restart"
    gateway = batch_cluster.gateway.listen
    with Admin(gateway) as admin:
        admin.create_topic(topic, read_queue_nums=1, message_type="TRANSACTION")
    with Producer(gateway, producer_group=group) as producer:
        before = commit_one(producer, topic, "before")
        assert before.committed is not None, before.error
    member = batch_cluster.broker("broker-a").master
    batch_cluster.restart_storage(member)
    batch_cluster.wait_dispatched(topic, 1)  # the dispatch follows the new storage

    with Admin(gateway) as admin, Producer(gateway, producer_group=group) as producer:
        # A produce may find the broker not registered again yet: retried by the client.
        after = commit_one(producer, topic, "after")
        assert after.committed is not None, after.error
        keys = [before.half.unique_key, after.half.unique_key]
        wait_until(
            lambda: all(admin.query_unique_key(topic, key) for key in keys),
            "both committed copies",
        )
        assert [len(admin.query_unique_key(topic, key)) for key in keys] == [1, 1]
        assert not admin.list_transactions(group)
