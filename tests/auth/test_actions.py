"""Every RPC of both services the gateway serves is in the one action table."""

from __future__ import annotations

from google.protobuf import message_factory

from services.gateway.auth.actions import ACTIONS, V1, V2
from tide.auth.model import Action, Resource, ResourceType
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2_service
from tide.v1 import gateway_pb2 as pb


def _methods() -> set[str]:
    v1_methods = pb.DESCRIPTOR.services_by_name["Gateway"].methods
    v2_methods = v2_service.DESCRIPTOR.services_by_name["MessagingService"].methods
    return {V1 + m.name for m in v1_methods} | {V2 + m.name for m in v2_methods}


def test_every_method_of_both_services_is_in_the_table() -> None:
    assert _methods() - set(ACTIONS) == set()
    assert set(ACTIONS) - _methods() == set()  # and nothing stale


def test_every_method_reads_an_empty_request() -> None:
    descriptors = {
        **{V1 + m.name: m for m in pb.DESCRIPTOR.services_by_name["Gateway"].methods},
        **{
            V2 + m.name: m
            for m in v2_service.DESCRIPTOR.services_by_name["MessagingService"].methods
        },
    }
    for method, needs in ACTIONS.items():
        request = message_factory.GetMessageClass(descriptors[method].input_type)()
        needs(request)  # no crash on a request naming nothing


def test_produce_needs_pub_on_each_topic_once() -> None:
    request = pb.ProduceRequest(
        messages=[
            pb.ProduceMessage(topic="a"),
            pb.ProduceMessage(topic="b"),
            pb.ProduceMessage(topic="a"),
        ]
    )
    assert ACTIONS[V1 + "Produce"](request) == [
        (Action.PUB, Resource(ResourceType.TOPIC, "a")),
        (Action.PUB, Resource(ResourceType.TOPIC, "b")),
    ]


def test_v2_receive_needs_sub_on_the_topic_and_the_group() -> None:
    request = v2_service.ReceiveMessageRequest(
        group=v2.Resource(name="g"), message_queue=v2.MessageQueue(topic=v2.Resource(name="t"))
    )
    assert ACTIONS[V2 + "ReceiveMessage"](request) == [
        (Action.SUB, Resource(ResourceType.TOPIC, "t")),
        (Action.SUB, Resource(ResourceType.GROUP, "g")),
    ]


def test_a_groups_retry_topic_is_the_group() -> None:
    """A push consumer pulls (and heartbeats) its group's %RETRY% topic: Sub on the group
    covers it, as in RocketMQ's ACL 2.0."""
    request = pb.PullRequest(topic="%RETRY%g-orders", consumer_group="g-orders")
    assert ACTIONS[V1 + "Pull"](request) == [(Action.SUB, Resource(ResourceType.GROUP, "g-orders"))]
    bare = pb.PullRequest(topic="%RETRY%", consumer_group="g")
    assert (Action.SUB, Resource(ResourceType.TOPIC, "%RETRY%")) in ACTIONS[V1 + "Pull"](bare)
