"""A FIFO message whose broker is down is not moved to another broker's queue (that
would split its message group over two queues): the produce answers the broker's error,
while a message of a group on the live broker is stored. Once the dead broker drops out
of the route the group hashes over the queues left (docs/client.md "Ordering")."""

from __future__ import annotations

from functools import partial

import grpc

from services.gateway.selection import hash_index
from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tests.services.gateway.test_failover import produce, served_by_only
from tests.services.gateway.test_fifo_produce import per_message, spread_batch
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until

fifo_failover_cluster = cluster_fixture(name="fifo_failover_cluster", brokers=2, scope="function")
QUEUES = 2


def _group_on(broker: str) -> str:
    """A message group that hashes to ``broker``'s queues (queues sorted by broker, id)."""
    first = 0 if broker == "broker-a" else QUEUES
    return next(
        key
        for key in (f"order-{i}" for i in range(1_000))
        if first <= hash_index(key, 2 * QUEUES) < first + QUEUES
    )


def test_a_fifo_message_is_not_moved_to_another_broker(fifo_failover_cluster: Cluster) -> None:
    cluster = fifo_failover_cluster
    topic = "T_fifo_failover"
    cluster.create_topic(topic, queues=QUEUES, message_type="FIFO")
    stub = cluster.gateway.stub
    on_a, on_b = _group_on("broker-a"), _group_on("broker-b")
    (before,) = produce(stub, pb.ProduceMessage(topic=topic, body=b"b", sharding_key=on_b))
    assert before.status == pb.ProduceResult.SEND_OK and before.broker_name == "broker-b"

    cluster.broker("broker-b").kill()
    to_b = pb.ProduceMessage(topic=topic, body=b"b", sharding_key=on_b)
    expect_error(grpc.StatusCode.UNAVAILABLE, lambda: produce(stub, to_b), "broker-b")
    to_a = pb.ProduceMessage(topic=topic, body=b"a", sharding_key=on_a)
    mixed = produce(stub, to_a, to_b)
    assert mixed[0].status == pb.ProduceResult.SEND_OK and mixed[0].broker_name == "broker-a"
    assert mixed[1].status == pb.ProduceResult.SEND_FAILED and "broker-b" in mixed[1].error

    for nameserver in cluster.nameservers:
        wait_until(
            partial(served_by_only, nameserver, topic, "broker-a"),
            f"broker-b to expire from name server {nameserver.listen}",
        )

    def stored_on() -> str | None:
        try:
            (result,) = produce(stub, to_b)
        except grpc.RpcError:  # the gateway's route still names broker-b
            return None
        return result.broker_name if result.status == pb.ProduceResult.SEND_OK else None

    # The gateway's route follows within its refresh interval.
    wait_until(lambda: stored_on() is not None, "the group to go to the queues left")
    assert stored_on() == "broker-a"


def test_a_batch_spread_over_both_brokers_fails_exactly_the_dead_broker_s_messages(
    fifo_failover_cluster: Cluster,
) -> None:
    """A batch of many groups over every queue (the plain path split by queue) with one
    broker down: its messages fail with the broker's error, per message or as compact
    runs, each in its place in the request's order; the live broker's are stored (a
    FIFO message never moves). A normal topic's keyed batch goes around the dead broker
    (hashed over the live broker's queues), as the general path retries it."""
    cluster = fifo_failover_cluster
    fifo, normal = "T_fifo_spread_failover", "T_keyed_spread_failover"
    cluster.create_topic(fifo, queues=QUEUES, message_type="FIFO")
    cluster.create_topic(normal, queues=QUEUES)
    stub = cluster.gateway.stub
    groups = [f"customer-{i}" for i in range(16)]
    on_b = {g for g in groups if hash_index(g, 2 * QUEUES) >= QUEUES}
    assert 0 < len(on_b) < len(groups)
    cluster.broker("broker-b").kill()

    for compact in (False, True):
        messages = spread_batch(fifo, groups, 3)
        request = pb.ProduceRequest(messages=messages, compact_results=compact)
        answered = per_message(stub.Produce(request, timeout=RPC_TIMEOUT_S))
        for message, (broker, queue_id, _, _, error) in zip(messages, answered, strict=True):
            if message.sharding_key in on_b:
                assert error.startswith("UNAVAILABLE: ") and "broker-b" in error, error
            else:
                assert not error, error
                index = hash_index(message.sharding_key, 2 * QUEUES)
                assert (broker, queue_id) == ("broker-a", index)

    messages = spread_batch(normal, groups, 3)
    answered = per_message(
        stub.Produce(pb.ProduceRequest(messages=messages), timeout=RPC_TIMEOUT_S)
    )
    for message, (broker, queue_id, _, _, error) in zip(messages, answered, strict=True):
        assert not error, error
        # On broker-a either way: its own queue, or the live broker's queues re-hashed.
        expected = hash_index(message.sharding_key, 2 * QUEUES)
        if message.sharding_key in on_b:
            expected = hash_index(message.sharding_key, QUEUES)
        assert (broker, queue_id) == ("broker-a", expected)
