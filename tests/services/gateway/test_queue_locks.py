"""Queue locks through a real cluster (gateway -> master storage): one holder per
(group, queue), the lease's expiry, unlock, GetQueueLocks, and the pull check: a pull
carrying the client id of a member that does not hold a locked queue is refused
FAILED_PRECONDITION naming the holder; the holder's and plain pulls are served."""

from __future__ import annotations

import time

import grpc

from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

LIVE_MS = 2_000
# Short leases: the storage grants nothing for one lease after its start.
cluster = cluster_fixture(brokers=1, storage_args=("--rebalance-lock-max-live-time-ms", "2000"))
GROUP = "lock-group"


def _request(topic: str, client_id: str, *queue_ids: int) -> pb.BrokerQueueLockRequest:
    return pb.BrokerQueueLockRequest(
        broker_name="broker-a",
        request=storage_pb.QueueLockRequest(
            consumer_group=GROUP,
            client_id=client_id,
            queues=[storage_pb.LockedQueue(topic=topic, queue_id=q) for q in queue_ids],
        ),
    )


def _lock(cluster: Cluster, topic: str, client_id: str, *queue_ids: int) -> list[int]:
    answer = cluster.gateway.stub.LockQueues(
        _request(topic, client_id, *queue_ids), timeout=RPC_TIMEOUT_S
    )
    assert answer.max_live_ms == LIVE_MS
    return [queue.queue_id for queue in answer.locked]


def _pull(cluster: Cluster, topic: str, queue_id: int, client_id: str = "") -> pb.PullResponse:
    answer: pb.PullResponse = cluster.gateway.stub.Pull(
        pb.PullRequest(
            consumer_group=GROUP,
            topic=topic,
            broker_name="broker-a",
            queue_id=queue_id,
            client_id=client_id,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    return answer


def _create(cluster: Cluster, topic: str) -> None:
    cluster.gateway.stub.CreateTopic(
        pb.CreateTopicRequest(topic=topic, read_queue_nums=2, write_queue_nums=2),
        timeout=RPC_TIMEOUT_S,
    )
    wait_until(  # past the storage's start grace (one lease)
        lambda: _lock(cluster, topic, "probe", 1) == [1], "the storage grants locks"
    )
    cluster.gateway.stub.UnlockQueues(_request(topic, "probe", 1), timeout=RPC_TIMEOUT_S)


def test_one_holder_and_the_pull_check(cluster: Cluster, topic_name: str) -> None:
    _create(cluster, topic_name)
    assert _lock(cluster, topic_name, "member-a", 0) == [0]
    assert _lock(cluster, topic_name, "member-b", 0, 1) == [1]
    locks = cluster.gateway.stub.GetQueueLocks(
        storage_pb.GetQueueLocksRequest(consumer_group=GROUP, topic=topic_name),
        timeout=RPC_TIMEOUT_S,
    ).locks
    assert [(lock.broker_name, lock.queue_id, lock.client_id) for lock in locks] == [
        ("broker-a", 0, "member-a"),
        ("broker-a", 1, "member-b"),
    ]
    assert all(0 < lock.expires_in_ms <= LIVE_MS for lock in locks)
    message = expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: _pull(cluster, topic_name, 0, "member-b"),
        "is locked by 'member-a'",
        f"group '{GROUP}'",
    )
    assert "'member-b'" in message
    assert _pull(cluster, topic_name, 0, "member-a").status != pb.PullResponse.STATUS_UNSPECIFIED
    _pull(cluster, topic_name, 0)  # no client id: not checked
    # Unlocked: the other member takes it at once.
    released = cluster.gateway.stub.UnlockQueues(
        _request(topic_name, "member-a", 0, 1), timeout=RPC_TIMEOUT_S
    ).released
    assert released == 1  # queue 1 is member-b's
    assert _lock(cluster, topic_name, "member-b", 0) == [0]
    _pull(cluster, topic_name, 0, "member-b")
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: _pull(cluster, topic_name, 0, "member-a"),
        "is locked by 'member-b'",
    )


def test_a_lease_not_renewed_expires(cluster: Cluster, topic_name: str) -> None:
    _create(cluster, topic_name)
    assert _lock(cluster, topic_name, "member-a", 0) == [0]
    assert _lock(cluster, topic_name, "member-b", 0) == []
    # Taken only once member-a's lease ran out (2 s after its lock; polled).
    wait_until(lambda: _lock(cluster, topic_name, "member-b", 0) == [0], "member-b takes queue 0")


def test_bad_lock_requests(cluster: Cluster, topic_name: str) -> None:
    stub = cluster.gateway.stub
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: stub.LockQueues(_request(topic_name, ""), timeout=RPC_TIMEOUT_S),
        "client_id is empty",
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: stub.LockQueues(_request(topic_name, "a"), timeout=RPC_TIMEOUT_S),
        "queues is empty",
    )
    too_many = _request(topic_name, "a", *range(1_025))
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: stub.LockQueues(too_many, timeout=RPC_TIMEOUT_S),
        "LOCK_QUEUES_MAX_COUNT",
    )


def test_a_restarted_storage_grants_no_lock_for_one_lease(
    cluster: Cluster, topic_name: str
) -> None:
    """Leases live in the master's memory: after a SIGKILL and restart, a lease granted
    before is unknown, so nothing is granted until one lease after the start (no
    earlier than LIVE_MS after the restart began; polled, no fixed wait)."""
    _create(cluster, topic_name)
    assert _lock(cluster, topic_name, "member-a", 0) == [0]
    member = cluster.brokers[0].master
    member.kill()
    restarted_s = time.monotonic()
    cluster.restart(member)
    wait_until(  # the restarted storage answers (through the gateway) ...
        lambda: _try_lock(cluster, topic_name, "member-b") is not None, "the storage back"
    )
    status = cluster.gateway.stub.GetQueueLocks(
        storage_pb.GetQueueLocksRequest(consumer_group=GROUP, topic=topic_name),
        timeout=RPC_TIMEOUT_S,
    )
    granted_s = None

    def granted() -> bool:
        nonlocal granted_s
        if _try_lock(cluster, topic_name, "member-b") == [0]:
            granted_s = time.monotonic()
        return granted_s is not None

    wait_until(granted, "member-b takes queue 0 after the grace")
    assert granted_s is not None
    # ... and granted nothing before one lease after its start (which followed
    # restarted_s): without the grace, member-b would have it as soon as the storage is
    # back (member-a's lease was forgotten by the crash).
    assert granted_s - restarted_s >= LIVE_MS / 1000
    # Back within one lease (the usual case): the storage said it grants nothing yet.
    if status.locks == [] and time.monotonic() - restarted_s < LIVE_MS / 1000:
        assert status.in_grace


def _try_lock(cluster: Cluster, topic: str, client_id: str) -> list[int] | None:
    """The queues locked, or None while the broker is not reachable yet."""
    try:
        return _lock(cluster, topic, client_id, 0)
    except grpc.RpcError:
        return None
