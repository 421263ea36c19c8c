"""ReceiveMessage on the gateway's POP consumption: an empty receive is held (not
answered at once) and woken by a message's arrival, which it then carries (status,
message, delivery timestamp); an expired or forged receipt handle is
INVALID_RECEIPT_HANDLE for AckMessage and ChangeInvisibleDuration; a receive past the
gateway's held-receive budget is TOO_MANY_REQUESTS."""

from __future__ import annotations

import threading

import grpc
from google.protobuf.duration_pb2 import Duration

from tests._cluster import RPC_TIMEOUT_S, Cluster, cluster_fixture
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.rocketmq_v2 import service_pb2_grpc as v2_grpc
from tide.v1 import gateway_pb2 as pb
from tide.waiting import wait_until


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


def _receive_one(stub: v2_grpc.MessagingServiceStub, topic: str, group: str) -> v2.Message:
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic)),
        batch_size=1,
        invisible_duration=Duration(seconds=10),  # the shortest: it expires soon
        long_polling_timeout=Duration(seconds=5),
    )
    answers = list(stub.ReceiveMessage(request, timeout=RPC_TIMEOUT_S))
    (message,) = [a.message for a in answers if a.WhichOneof("content") == "message"]
    return message


def test_expired_and_forged_receipt_handles_are_invalid(
    cluster: Cluster, topic_name: str, v2_stub: v2_grpc.MessagingServiceStub
) -> None:
    cluster.create_topic(topic_name, queues=1)
    group = "G_expired"
    cluster.gateway.stub.Produce(
        pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic_name, body=b"late")]),
        timeout=RPC_TIMEOUT_S,
    )
    cluster.wait_dispatched(topic_name, 1)
    message = _receive_one(v2_stub, topic_name, group)
    handle = message.system_properties.receipt_handle

    def inflight() -> int:
        lag = cluster.gateway.stub.GetGroupLag(
            pb.GetGroupLagRequest(consumer_group=group, topic=topic_name), timeout=RPC_TIMEOUT_S
        )
        return int(lag.inflight)

    wait_until(lambda: inflight() == 0, "the invisible time passed (revived)", state=inflight)
    group_resource, topic_resource = v2.Resource(name=group), v2.Resource(name=topic_name)
    for receipt_handle in (handle, "P1.forged"):
        acked = v2_stub.AckMessage(
            v2s.AckMessageRequest(
                group=group_resource,
                topic=topic_resource,
                entries=[v2s.AckMessageEntry(message_id="x", receipt_handle=receipt_handle)],
            ),
            timeout=RPC_TIMEOUT_S,
        )
        assert acked.status.code == v2.INVALID_RECEIPT_HANDLE, acked
        assert acked.entries[0].status.code == v2.INVALID_RECEIPT_HANDLE
        changed = v2_stub.ChangeInvisibleDuration(
            v2s.ChangeInvisibleDurationRequest(
                group=group_resource,
                topic=topic_resource,
                receipt_handle=receipt_handle,
                invisible_duration=Duration(seconds=30),
            ),
            timeout=RPC_TIMEOUT_S,
        )
        assert changed.status.code == v2.INVALID_RECEIPT_HANDLE, changed
        assert changed.status.message


no_held = cluster_fixture(
    name="no_held", brokers=1, scope="function", gateway_args=("--max-held-receives", "0")
)


def test_a_receive_past_the_held_budget_is_too_many_requests(
    no_held: Cluster, topic_name: str
) -> None:
    no_held.create_topic(topic_name, queues=1)
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name="G_budget"),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=topic_name)),
        batch_size=1,
        invisible_duration=Duration(seconds=30),
        long_polling_timeout=Duration(seconds=5),
    )
    with grpc.insecure_channel(no_held.gateway.listen) as channel:
        stub = v2_grpc.MessagingServiceStub(channel)
        answers = list(stub.ReceiveMessage(request, timeout=RPC_TIMEOUT_S))
    assert len(answers) == 1, answers  # the status alone, at once
    assert answers[0].status.code == v2.TOO_MANY_REQUESTS, answers[0]
    assert "--max-held-receives" in answers[0].status.message
