"""Topic admin through the gateway, the bad-input matrix, reflection (ours and a
third-party reflection client's)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests._cluster import CLUSTER_NAME, MAX_BODY_BYTES, Cluster, cluster_fixture
from tests._service_process import child_env
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tests.services.storage.conftest import REPO
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import storage_pb2 as storage_pb

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


def route(stub: pb_grpc.GatewayStub, topic: str) -> ns_pb.TopicRoute:
    answer: ns_pb.TopicRoute = stub.GetTopicRoute(
        ns_pb.GetTopicRouteRequest(topic=topic), timeout=RPC_TIMEOUT_S
    )
    return answer


def queue_nums(answer: ns_pb.TopicRoute) -> dict[str, tuple[int, int, int]]:
    return {
        q.broker_name: (q.read_queue_nums, q.write_queue_nums, q.perm) for q in answer.queue_datas
    }


# -- admin ---------------------------------------------------------------------------
def test_create_update_list_route_and_delete(cluster: Cluster, topic_name: str) -> None:
    stub = cluster.gateway.stub
    created = stub.CreateTopic(
        pb.CreateTopicRequest(topic=topic_name, broker_names=["broker-b"]), timeout=RPC_TIMEOUT_S
    )
    assert list(created.broker_names) == ["broker-b"]
    assert queue_nums(route(stub, topic_name)) == {"broker-b": (4, 4, 6)}  # the defaults
    # Again on the whole cluster, with other numbers: created on a, updated on b.
    created = stub.CreateTopic(
        pb.CreateTopicRequest(
            topic=topic_name, read_queue_nums=3, write_queue_nums=2, cluster_name=CLUSTER_NAME
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert list(created.broker_names) == ["broker-a", "broker-b"]
    answer = route(stub, topic_name)
    assert queue_nums(answer) == {"broker-a": (3, 2, 6), "broker-b": (3, 2, 6)}
    addresses = {b.broker_name: b.addresses[0] for b in answer.broker_datas}
    for broker in cluster.brokers:
        assert addresses[broker.name].storage == broker.storage_address
        assert addresses[broker.name].dispatch == broker.dispatch_address
    topics = stub.ListTopics(ns_pb.ListRouteTopicsRequest(), timeout=RPC_TIMEOUT_S).topics
    assert topic_name in topics and list(topics) == sorted(topics)

    deleted = stub.DeleteTopic(
        storage_pb.DeleteTopicRequest(topic=topic_name), timeout=RPC_TIMEOUT_S
    )
    assert deleted.existed
    expect_error(NOT_FOUND, lambda: route(stub, topic_name), "tide topic create")
    assert (
        topic_name
        not in stub.ListTopics(ns_pb.ListRouteTopicsRequest(), timeout=RPC_TIMEOUT_S).topics
    )
    expect_error(
        NOT_FOUND,
        lambda: stub.Produce(
            pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic_name, body=b"x")]),
            timeout=RPC_TIMEOUT_S,
        ),
        topic_name,
    )


def test_read_only_topic_refuses_produce(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, perm=4)
    stub = cluster.gateway.stub
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: stub.Produce(
            pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic_name, body=b"x")]),
            timeout=RPC_TIMEOUT_S,
        ),
        "writable",
    )
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: stub.Produce(
            pb.ProduceRequest(
                messages=[
                    pb.ProduceMessage(
                        topic=topic_name, body=b"x", queue=pb.QueueRef(broker_name="broker-a")
                    )
                ]
            ),
            timeout=RPC_TIMEOUT_S,
        ),
        "perm",
    )


def test_cluster_info_lists_every_broker(cluster: Cluster) -> None:
    info = cluster.gateway.stub.GetClusterInfo(ns_pb.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S)
    assert list(info.clusters[CLUSTER_NAME].broker_names) == ["broker-a", "broker-b"]
    live = {
        (b.broker_name, b.broker_id, b.address.storage, b.address.dispatch) for b in info.brokers
    }
    assert live == {(b.name, 0, b.storage_address, b.dispatch_address) for b in cluster.brokers}


# -- bad input -----------------------------------------------------------------------
def produce_call(stub: pb_grpc.GatewayStub, *messages: pb.ProduceMessage) -> Callable[[], object]:
    return lambda: stub.Produce(pb.ProduceRequest(messages=list(messages)), timeout=RPC_TIMEOUT_S)


@pytest.mark.parametrize(
    ("fields", "code", "fragment"),
    [
        ({"topic": "../x"}, INVALID, "messages[1].topic"),
        ({"topic": ""}, INVALID, "topic is empty"),
        ({"topic": "a b"}, INVALID, "contains ' '"),
        ({"topic": "t" * 128}, INVALID, "127 bytes"),
        ({"body": b""}, INVALID, "body is empty"),
        ({"body": b"x" * (MAX_BODY_BYTES + 1)}, INVALID, "--max-message-body-bytes"),
        ({"keys": ["a b"]}, INVALID, "keys[0]"),
        ({"keys": [""]}, INVALID, "keys[0]"),
        ({"tags": "a\x01b"}, INVALID, "tags"),
        ({"properties": {"n\x02": "v"}}, INVALID, "reserved"),
        ({"properties": {"UNIQ_KEY": "v"}}, INVALID, "unique_key field"),
        ({"unique_key": "has space"}, INVALID, "unique_key"),
        ({"born_timestamp_ms": -1}, INVALID, "born_timestamp_ms"),
        ({"queue": pb.QueueRef(broker_name="broker-a", queue_id=-1)}, INVALID, "queue_id"),
        ({"queue": pb.QueueRef(broker_name="", queue_id=0)}, INVALID, "broker_name is empty"),
        ({"queue": pb.QueueRef(broker_name="broker-a", queue_id=4)}, NOT_FOUND, "out of range"),
        ({"queue": pb.QueueRef(broker_name="broker-z", queue_id=0)}, NOT_FOUND, "broker-z"),
    ],
)
def test_bad_produce_messages(
    cluster: Cluster, fields: dict[str, object], code: grpc.StatusCode, fragment: str
) -> None:
    topic = "T_bad_produce"
    cluster.create_topic(topic, queues=2)
    message = pb.ProduceMessage(topic=topic, body=b"fine")
    for name, value in fields.items():
        if isinstance(value, pb.QueueRef):
            message.queue.CopyFrom(value)
        elif isinstance(value, dict):
            message.properties.update(value)
        elif isinstance(value, list):
            message.keys.extend(value)
        else:
            setattr(message, name, value)
    stub = cluster.gateway.stub
    ok = pb.ProduceMessage(topic=topic, body=b"good")
    expect_error(code, produce_call(stub, ok, message), fragment)


def test_bad_produce_requests(cluster: Cluster) -> None:
    stub = cluster.gateway.stub
    expect_error(INVALID, produce_call(stub), "messages is empty")
    expect_error(
        NOT_FOUND,
        produce_call(stub, pb.ProduceMessage(topic="T_never_created", body=b"x")),
        "tide topic create T_never_created",
    )
    cluster.create_topic("T_bad_batch", queues=1)
    many = [pb.ProduceMessage(topic="T_bad_batch", body=b"x")] * 1001
    expect_error(INVALID, produce_call(stub, *many), "--max-produce-messages")


def test_a_batch_of_bodies_names_its_bad_message(cluster: Cluster) -> None:
    """A batch of bodies only is told from its bytes (tide.format.scan_bodies); one
    message past a bound sends it to the field-by-field check, which names it."""
    topic = "T_bodies_bad"
    cluster.create_topic(topic, queues=1)
    stub = cluster.gateway.stub
    messages = [pb.ProduceMessage(topic=topic, body=b"b" * MAX_BODY_BYTES)] * 100
    over = pb.ProduceMessage(topic=topic, body=b"b" * (MAX_BODY_BYTES + 1))
    expect_error(
        INVALID,
        produce_call(stub, *messages[:57], over, *messages[58:]),
        f"messages[57].body is {MAX_BODY_BYTES + 1} bytes; the limit is {MAX_BODY_BYTES}",
    )
    bad_topic = [pb.ProduceMessage(topic="../x", body=b"x")] * 3
    expect_error(INVALID, produce_call(stub, *bad_topic), "messages[0].topic")
    second_topic = [*messages[:3], pb.ProduceMessage(topic="../x", body=b"x")]
    expect_error(INVALID, produce_call(stub, *second_topic), "messages[3].topic")


@pytest.mark.parametrize("compact", [False, True])
def test_a_batch_of_bodies_is_stored_as_sent(cluster: Cluster, compact: bool) -> None:
    """Bodies at the size bound and of one byte, each with its generated unique key."""
    topic = f"T_bodies_stored_{int(compact)}"
    cluster.create_topic(topic, queues=1, brokers=["broker-a"])
    stub = cluster.gateway.stub
    bodies = [bytes([n]) * (MAX_BODY_BYTES if n % 2 else 1) for n in range(40)]
    answer = stub.Produce(
        pb.ProduceRequest(
            messages=[pb.ProduceMessage(topic=topic, body=body) for body in bodies],
            compact_results=compact,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    if compact:
        (run,) = answer.runs
        assert (run.count, run.status, run.first_queue_offset) == (40, pb.ProduceResult.SEND_OK, 0)
        keys = list(run.unique_keys)
    else:
        keys = [result.unique_key for result in answer.results]
    assert len(set(keys)) == 40 and all(len(key) == 32 for key in keys)
    pull = pb.PullRequest(
        consumer_group="G_bodies", topic=topic, broker_name="broker-a", queue_id=0,
        max_messages=64, long_poll_timeout_ms=5_000,
    )  # fmt: skip
    pulled = stub.Pull(pull, timeout=RPC_TIMEOUT_S)
    while len(pulled.messages) < len(bodies):  # the dispatch may be applying the rest
        pull.offset = pulled.next_offset
        more = stub.Pull(pull, timeout=RPC_TIMEOUT_S)
        assert more.messages, more
        pulled.messages.extend(more.messages)
        pulled.next_offset = more.next_offset
    assert [m.body for m in pulled.messages] == bodies
    assert [m.properties["UNIQ_KEY"] for m in pulled.messages] == keys
    assert {(m.flag, m.tags, tuple(m.keys)) for m in pulled.messages} == {(0, "", ())}


@pytest.mark.parametrize(
    ("fields", "code", "fragment"),
    [
        ({"topic": "../x"}, INVALID, "topic"),
        ({"topic": "T_never_created"}, NOT_FOUND, "tide topic create"),
        ({"broker_name": ""}, INVALID, "broker_name is empty"),
        ({"broker_name": "broker-z"}, NOT_FOUND, "broker-z"),
        ({"queue_id": 2}, NOT_FOUND, "0..1"),
        ({"queue_id": -3}, INVALID, "queue_id"),
        ({"offset": -1}, INVALID, "offset"),
        ({"max_messages": 1025}, INVALID, "max_messages"),
        ({"max_messages": -1}, INVALID, "max_messages"),
        ({"long_poll_timeout_ms": 30_001}, INVALID, "--max-long-poll-ms"),
        ({"long_poll_timeout_ms": -5}, INVALID, "long_poll_timeout_ms"),
        ({"expression": "A ||"}, INVALID, "expression"),
        ({"expression": "A | B"}, INVALID, "expression"),
        ({"expression": "A || *"}, INVALID, "expression"),
        ({"consumer_group": "bad group"}, INVALID, "consumer group"),
    ],
)
def test_bad_pulls(
    cluster: Cluster, fields: dict[str, object], code: grpc.StatusCode, fragment: str
) -> None:
    topic = "T_bad_pull"
    cluster.create_topic(topic, queues=2)
    request = pb.PullRequest(topic=topic, broker_name="broker-a", queue_id=0)
    for name, value in fields.items():
        setattr(request, name, value)
    stub = cluster.gateway.stub
    expect_error(code, lambda: stub.Pull(request, timeout=RPC_TIMEOUT_S), fragment)


def test_bad_queries(cluster: Cluster) -> None:
    stub = cluster.gateway.stub

    def query(request: pb.QueryMessageRequest) -> Callable[[], object]:
        return lambda: stub.QueryMessage(request, timeout=RPC_TIMEOUT_S)

    expect_error(INVALID, query(pb.QueryMessageRequest()), "msg_id, key or unique_key")
    expect_error(INVALID, query(pb.QueryMessageRequest(msg_id="xyz")), "32 (IPv4)")
    expect_error(INVALID, query(pb.QueryMessageRequest(msg_id="Z" * 32)), "hexadecimal")
    unknown_host = "0A0000010000270F" + "0" * 16  # 10.0.0.1:9999
    expect_error(NOT_FOUND, query(pb.QueryMessageRequest(msg_id=unknown_host)), "10.0.0.1:9999")
    storage = cluster.brokers[0].storage.listen
    host, port = storage.split(":")
    prefix = bytes(int(part) for part in host.split(".")).hex() + f"{int(port):08x}"
    beyond = (prefix + f"{2**40:016x}").upper()
    expect_error(NOT_FOUND, query(pb.QueryMessageRequest(msg_id=beyond)), "not found")
    expect_error(
        INVALID, query(pb.QueryMessageRequest(key=pb.KeyQuery(topic="../x", key="k"))), "topic"
    )
    expect_error(
        INVALID, query(pb.QueryMessageRequest(key=pb.KeyQuery(topic="T_q", key=""))), "empty"
    )
    cluster.create_topic("T_bad_query", queues=1)
    expect_error(
        INVALID,
        query(
            pb.QueryMessageRequest(key=pb.KeyQuery(topic="T_bad_query", key="k", max_count=1001))
        ),
        "max_count",
    )
    expect_error(
        INVALID,
        query(
            pb.QueryMessageRequest(
                key=pb.KeyQuery(topic="T_bad_query", key="k", begin_ms=10, end_ms=5)
            )
        ),
        "after",
    )


def test_bad_admin_and_offset_calls(cluster: Cluster) -> None:
    stub = cluster.gateway.stub

    def create(**fields: object) -> Callable[[], object]:
        return lambda: stub.CreateTopic(pb.CreateTopicRequest(**fields), timeout=RPC_TIMEOUT_S)  # type: ignore[arg-type]

    expect_error(INVALID, create(topic="../x"), "topic")
    expect_error(INVALID, create(topic="T_a", read_queue_nums=1025), "read_queue_nums")
    expect_error(INVALID, create(topic="T_a", write_queue_nums=-1), "write_queue_nums")
    expect_error(INVALID, create(topic="T_a", perm=9), "perm")
    expect_error(NOT_FOUND, create(topic="T_a", broker_names=["broker-z"]), "broker-z")
    expect_error(NOT_FOUND, create(topic="T_a", cluster_name="NoSuchCluster"), "NoSuchCluster")
    expect_error(
        NOT_FOUND,
        lambda: stub.DeleteTopic(
            storage_pb.DeleteTopicRequest(topic="T_never_created"), timeout=RPC_TIMEOUT_S
        ),
        "T_never_created",
    )
    expect_error(
        INVALID,
        lambda: stub.GetTopicRoute(ns_pb.GetTopicRouteRequest(topic="a/b"), timeout=RPC_TIMEOUT_S),
        "topic",
    )
    cluster.create_topic("T_bad_offsets", queues=1)
    topic, broker = "T_bad_offsets", "broker-a"
    expect_error(
        INVALID,
        lambda: stub.CommitOffset(
            pb.CommitConsumerOffsetRequest(
                consumer_group="G", topic=topic, broker_name=broker, offset=-1
            ),
            timeout=RPC_TIMEOUT_S,
        ),
        "offset",
    )
    expect_error(
        INVALID,
        lambda: stub.GetOffset(
            pb.GetConsumerOffsetRequest(consumer_group="", topic=topic, broker_name=broker),
            timeout=RPC_TIMEOUT_S,
        ),
        "consumer group",
    )
    expect_error(
        NOT_FOUND,
        lambda: stub.GetQueueOffsets(
            pb.QueueOffsetsRequest(topic=topic, broker_name=broker, queue_id=5),
            timeout=RPC_TIMEOUT_S,
        ),
        "out of range",
    )
    expect_error(
        INVALID,
        lambda: stub.Heartbeat(
            storage_pb.ConsumerHeartbeatRequest(consumer_group="G", client_id=""),
            timeout=RPC_TIMEOUT_S,
        ),
        "client_id",
    )
    expect_error(
        INVALID,
        lambda: stub.Heartbeat(
            storage_pb.ConsumerHeartbeatRequest(
                consumer_group="G",
                client_id="c",
                subscriptions=[storage_pb.Subscription(topic="T_bad_offsets", expression="|| x")],
            ),
            timeout=RPC_TIMEOUT_S,
        ),
        "subscriptions[0].expression",
    )


# -- reflection ----------------------------------------------------------------------
def test_reflection_lists_the_gateway(cluster: Cluster) -> None:
    database = ProtoReflectionDescriptorDatabase(cluster.gateway.channel)
    services = database.get_services()
    assert "tide.v1.Gateway" in services
    assert "grpc.health.v1.Health" in services
    descriptor = database.FindFileContainingSymbol("tide.v1.Gateway")
    assert descriptor.name == "tide/v1/gateway.proto"


def test_every_service_of_the_cluster_serves_reflection_and_health(cluster: Cluster) -> None:
    """What grpcurl needs from each of the four services of a running cluster."""
    broker = cluster.brokers[0]
    endpoints = {
        "tide.v1.NameServer": cluster.nameservers[0].channel,
        "tide.v1.Storage": broker.storage.channel,
        "tide.v1.Dispatch": broker.dispatch.channel,
        "tide.v1.Gateway": cluster.gateway.channel,
    }
    for name, channel in endpoints.items():
        services = ProtoReflectionDescriptorDatabase(channel).get_services()
        assert name in services, (name, services)
        assert "grpc.reflection.v1alpha.ServerReflection" in services, services
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", name):
            reply = health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING, (name, service)


THIRD_PARTY_CLIENT = textwrap.dedent(
    """
    import base64, json, sys
    from grpc_requests import Client

    assert "tide" not in sys.modules
    client = Client.get_by_endpoint(sys.argv[1])
    assert "tide.v1.Gateway" in client.service_names, client.service_names
    reply = client.request(
        "tide.v1.Gateway",
        "Produce",
        {"messages": [{"topic": sys.argv[2], "body": base64.b64encode(b"hi").decode(),
                       "tags": "R"}]},
    )
    print(json.dumps(reply))
    assert not any(name.startswith("tide") for name in sys.modules), "used our stubs"
    """
)


def test_third_party_reflection_client_produces(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    done = subprocess.run(
        [sys.executable, "-c", THIRD_PARTY_CLIENT, cluster.gateway.listen, topic_name],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout.strip().splitlines()[-1])
    result = reply["results"][0]  # grpc_requests keeps the proto field names
    assert result["broker_name"] in ("broker-a", "broker-b"), result
    assert len(result["msg_id"]) == 32
    found = cluster.gateway.stub.QueryMessage(
        pb.QueryMessageRequest(msg_id=result["msg_id"]), timeout=RPC_TIMEOUT_S
    )
    assert found.messages[0].message.body == b"hi"
    assert found.messages[0].message.tags == "R"


# -- auto-create ---------------------------------------------------------------------
auto_cluster = cluster_fixture(
    name="auto_cluster",
    brokers=2,
    scope="function",
    gateway_args=("--auto-create-topics", "--default-queue-nums", "2"),
)


def test_auto_create_topics_on_first_produce(auto_cluster: Cluster) -> None:
    stub = auto_cluster.gateway.stub
    results = [  # one request each: successive requests rotate over the queues
        result
        for _ in range(8)
        for result in stub.Produce(
            pb.ProduceRequest(messages=[pb.ProduceMessage(topic="T_auto_created", body=b"x")]),
            timeout=RPC_TIMEOUT_S,
        ).results
    ]
    assert all(r.status == pb.ProduceResult.SEND_OK for r in results)
    assert {(r.broker_name, r.queue_id) for r in results} == {
        (b, q) for b in ("broker-a", "broker-b") for q in (0, 1)
    }
    assert queue_nums(route(stub, "T_auto_created")) == {
        "broker-a": (2, 2, 6),
        "broker-b": (2, 2, 6),
    }
    expect_error(
        INVALID,
        produce_call(stub, pb.ProduceMessage(topic="../auto", body=b"x")),
        "messages[0].topic",
    )
