"""A Receive across several brokers (docs/pop.md, "A Receive"): the masters are asked
concurrently, each for a share of max_messages, so one answer never holds more than
max_messages and no message a broker handed out is dropped (the group's inflight count
equals what the consumer got); a broker short of its share leaves the rest to the
others in a next round."""

from __future__ import annotations

from services.gateway.pop import POP_BROKERS_AT_ONCE, receive_shares
from tests._cluster import Cluster, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S
from tests.services.gateway.test_pop import INVISIBLE_MS, receive
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.waiting import wait_until

cluster = cluster_fixture(brokers=2)
QUEUES = 2


def produce_to(stub: pb_grpc.GatewayStub, topic: str, broker: str, count: int) -> list[str]:
    """``count`` messages to ``broker``'s queues, alternately."""
    ids: list[str] = []
    for i in range(count):
        reply = stub.Produce(
            pb.ProduceRequest(
                messages=[
                    pb.ProduceMessage(
                        topic=topic,
                        body=f"{broker}-{i}".encode(),
                        queue=pb.QueueRef(broker_name=broker, queue_id=i % QUEUES),
                    )
                ]
            ),
            timeout=RPC_TIMEOUT_S,
        )
        ids.append(reply.results[0].msg_id)
    return ids


def wait_all_dispatched(cluster: Cluster, topic: str, per_queue: dict[str, int]) -> None:
    for broker, count in per_queue.items():
        for queue_id in range(QUEUES):
            cluster.wait_dispatched(topic, count // QUEUES, broker, queue_id)


def inflight(stub: pb_grpc.GatewayStub, group: str, topic: str) -> int:
    lag = stub.GetGroupLag(
        pb.GetGroupLagRequest(consumer_group=group, topic=topic), timeout=RPC_TIMEOUT_S
    )
    return int(lag.inflight)


def test_receive_shares_add_up_to_what_is_wanted() -> None:
    assert receive_shares(10, 2) == [5, 5]
    assert receive_shares(7, 3) == [3, 2, 2]
    assert receive_shares(1, 3) == [1, 0, 0]
    many = receive_shares(100, POP_BROKERS_AT_ONCE + 4)
    assert sum(many) == 100 and many[POP_BROKERS_AT_ONCE:] == [0, 0, 0, 0]


def test_a_receive_across_two_brokers_returns_at_most_max_and_loses_none(
    cluster: Cluster,
) -> None:
    topic, group = "T_pop2_both", "G_pop2_both"
    cluster.create_topic(topic, queues=QUEUES)
    stub = cluster.gateway.stub
    ids = produce_to(stub, topic, "broker-a", 12) + produce_to(stub, topic, "broker-b", 12)
    wait_all_dispatched(cluster, topic, {"broker-a": 12, "broker-b": 12})
    got: list[pb.ReceivedMessage] = []
    while len(got) < len(ids):
        answer = receive(stub, group, topic, max_messages=10)
        assert 0 < len(answer) <= 10
        if not got:  # both brokers had more than their share of 5
            assert len(answer) == 10
            assert {m.broker_name for m in answer} == {"broker-a", "broker-b"}
        got += answer
        # Every message handed out reached the consumer: the brokers hold exactly these.
        assert inflight(stub, group, topic) == len(got)
    assert sorted(m.message.msg_id for m in got) == sorted(ids)
    assert receive(stub, group, topic) == []


def test_a_broker_short_of_its_share_leaves_the_rest_to_the_other(cluster: Cluster) -> None:
    topic, group = "T_pop2_one", "G_pop2_one"
    cluster.create_topic(topic, queues=QUEUES)
    stub = cluster.gateway.stub
    ids = produce_to(stub, topic, "broker-b", 12)
    wait_all_dispatched(cluster, topic, {"broker-b": 12})
    # Whichever broker the turn asks first, one Receive gets 8 of broker-b's messages,
    # and with max_messages 1 the one message (broker-a's share may be all of it).
    for wanted in (8, 1, 1):
        answer = receive(stub, group, topic, max_messages=wanted)
        assert len(answer) == wanted
        assert {m.broker_name for m in answer} == {"broker-b"}
    assert inflight(stub, group, topic) == 10
    rest = receive(stub, group, topic, max_messages=32)
    assert len(rest) == 2 and inflight(stub, group, topic) == 12
    assert len({m.message.msg_id for m in rest} | set(ids)) == len(ids)


def test_a_held_receive_is_woken_by_either_broker(cluster: Cluster) -> None:
    topic, group = "T_pop2_held", "G_pop2_held"
    cluster.create_topic(topic, queues=QUEUES)
    stub = cluster.gateway.stub
    for broker in ("broker-a", "broker-b"):
        wait_until(lambda: cluster.gateway.held_pulls() == 0, "no long poll held")
        future = stub.Receive.future(
            pb.ReceiveRequest(
                consumer_group=group,
                topic=topic,
                max_messages=4,
                invisible_duration_ms=INVISIBLE_MS,
                long_poll_timeout_ms=25_000,
            ),
            timeout=60,
        )
        wait_until(lambda: cluster.gateway.held_pulls() >= 1, "the Receive held")
        (msg_id,) = produce_to(stub, topic, broker, 1)
        reply = future.result(timeout=60)
        # A held Receive that timed out answers empty: the message means the arrival woke it.
        assert [(m.message.msg_id, m.broker_name) for m in reply.messages] == [(msg_id, broker)]
