"""A FIFO message whose broker is down is not moved to another broker's queue (that
would split its message group over two queues): the produce answers the broker's error,
while a message of a group on the live broker is stored. Once the dead broker drops out
of the route the group hashes over the queues left (docs/client.md "Ordering")."""

from __future__ import annotations

from functools import partial

import grpc

from services.gateway.selection import hash_index
from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import expect_error
from tests.services.gateway.test_failover import produce, served_by_only
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
