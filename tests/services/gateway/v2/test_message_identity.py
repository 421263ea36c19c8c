"""One message model, two wire APIs: a message produced through tide.v1 reads through v2
with the same id (UNIQ_KEY), keys, tags, body and user properties (the reverse, with
the official client, is test_official_producer.py); and the v2 edge's overload answer."""

from __future__ import annotations

import hashlib

import grpc

from tests._cluster import RPC_TIMEOUT_S, Cluster, cluster_fixture
from tide.format import SHARDING_KEY
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.rocketmq_v2 import service_pb2_grpc as v2_grpc
from tide.v1 import gateway_pb2 as pb

MIB = 1024 * 1024
small_budget = cluster_fixture(
    name="small_budget",
    brokers=1,
    scope="function",
    gateway_args=("--max-produce-in-flight-bytes", str(MIB)),
)


def _pull(stub: v2_grpc.MessagingServiceStub, topic: str) -> list[v2s.PullMessageResponse]:
    request = v2s.PullMessageRequest(
        group=v2.Resource(name="V2_identity"),
        message_queue=v2.MessageQueue(
            topic=v2.Resource(name=topic), id=0, broker=v2.Broker(name="broker-a")
        ),
        offset=0,
        batch_size=16,
    )
    return list(stub.PullMessage(request, timeout=RPC_TIMEOUT_S))


def test_a_tide_v1_message_reads_through_v2_as_it_was_produced(
    cluster: Cluster, topic_name: str, v2_stub: v2_grpc.MessagingServiceStub
) -> None:
    cluster.create_topic(topic_name, queues=1, message_type="FIFO")
    produced = cluster.gateway.stub.Produce(
        pb.ProduceRequest(
            messages=[
                pb.ProduceMessage(
                    topic=topic_name,
                    body=b"from tide.v1",
                    tags="TagA",
                    keys=["k1", "k2"],
                    properties={"color": "blue"},
                    sharding_key="order-7",
                )
            ]
        ),
        timeout=RPC_TIMEOUT_S,
    )
    unique_key = produced.results[0].unique_key
    cluster.wait_dispatched(topic_name, 1)
    status, found, next_offset = _pull(v2_stub, topic_name)
    assert status.status.code == v2.OK
    message = found.message
    system = message.system_properties
    assert system.message_id == unique_key
    assert system.tag == "TagA"
    assert list(system.keys) == ["k1", "k2"]
    assert system.message_group == "order-7"
    assert dict(message.user_properties) == {"color": "blue"}  # system ones are not users'
    assert SHARDING_KEY not in message.user_properties
    assert message.body == b"from tide.v1"
    assert system.body_encoding == v2.IDENTITY
    assert system.body_digest.type == v2.MD5
    assert system.body_digest.checksum == hashlib.md5(b"from tide.v1").hexdigest().upper()
    assert system.queue_offset == 0 and system.store_host
    assert next_offset.next_offset == 1


def test_a_send_past_the_in_flight_budget_is_too_many_requests(
    small_budget: Cluster, topic_name: str
) -> None:
    small_budget.create_topic(topic_name, queues=1)
    body = b"x" * 60_000  # under the body limit; 20 of them pass the 1 MiB budget
    request = v2s.SendMessageRequest(
        messages=[
            v2.Message(
                topic=v2.Resource(name=topic_name),
                body=body,
                system_properties=v2.SystemProperties(message_id=f"01{i:032X}"),
            )
            for i in range(20)
        ]
    )
    with grpc.insecure_channel(small_budget.gateway.listen) as channel:
        reply = v2_grpc.MessagingServiceStub(channel).SendMessage(request, timeout=RPC_TIMEOUT_S)
    assert reply.status.code == v2.TOO_MANY_REQUESTS, reply.status
    assert "max_produce_in_flight_bytes" in reply.status.message
