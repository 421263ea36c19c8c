"""ReceiveMessage's long polling on the gateway's POP consumption (needs
services/gateway/pop.py): an empty receive is held (not answered at once) and woken by a
message's arrival, which it then carries: status, message, delivery timestamp."""

from __future__ import annotations

import threading

import grpc
from google.protobuf.duration_pb2 import Duration

from tests._cluster import RPC_TIMEOUT_S, Cluster
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.rocketmq_v2 import service_pb2_grpc as v2_grpc
from tide.v1 import gateway_pb2 as pb


def test_an_empty_receive_is_held_until_a_message_arrives(
    cluster: Cluster, topic_name: str, v2_stub: v2_grpc.MessagingServiceStub
) -> None:
    cluster.create_topic(topic_name, queues=1)
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name="G_held"),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic_name)),
        batch_size=1,
        invisible_duration=Duration(seconds=30),
        long_polling_timeout=Duration(seconds=20),
    )
    answers: list[v2s.ReceiveMessageResponse] = []
    failed: list[grpc.RpcError] = []

    def receive() -> None:
        try:
            answers.extend(v2_stub.ReceiveMessage(request, timeout=RPC_TIMEOUT_S + 10))
        except grpc.RpcError as exc:
            failed.append(exc)

    receiver = threading.Thread(target=receive)
    receiver.start()
    try:
        cluster.gateway.wait_held(1)  # held, not answered empty at once
        produced = cluster.gateway.stub.Produce(
            pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic_name, body=b"wake")]),
            timeout=RPC_TIMEOUT_S,
        )
    finally:
        receiver.join(RPC_TIMEOUT_S + 15)
    assert not failed, failed
    kinds = [answer.WhichOneof("content") for answer in answers]
    assert kinds == ["status", "message", "delivery_timestamp"], answers
    assert answers[0].status.code == v2.OK
    message = answers[1].message
    assert message.system_properties.message_id == produced.results[0].unique_key
    assert message.body == b"wake" and message.system_properties.delivery_attempt == 1
