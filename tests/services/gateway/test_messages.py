"""Produce, pull, long polling and queries through a real gateway in front of two real
brokers and a name server."""

from __future__ import annotations

import time
from collections import Counter

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests._cluster import Cluster
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

Status = pb.PullResponse.Status


def produce(stub: pb_grpc.GatewayStub, *messages: pb.ProduceMessage) -> list[pb.ProduceResult]:
    reply = stub.Produce(pb.ProduceRequest(messages=list(messages)), timeout=RPC_TIMEOUT_S)
    assert len(reply.results) == len(messages)
    return list(reply.results)


def pull(
    stub: pb_grpc.GatewayStub,
    topic: str,
    broker: str,
    queue_id: int,
    offset: int = 0,
    **fields: object,
) -> pb.PullResponse:
    request = pb.PullRequest(
        consumer_group="G_test", topic=topic, broker_name=broker, queue_id=queue_id, offset=offset
    )
    for name, value in fields.items():
        setattr(request, name, value)
    response: pb.PullResponse = stub.Pull(request, timeout=RPC_TIMEOUT_S)
    return response


def pull_until(
    stub: pb_grpc.GatewayStub, topic: str, broker: str, queue_id: int, count: int, **fields: object
) -> list[pb.PullResponse]:
    """Pull from offset 0 (long polling) until ``count`` messages came; every answer."""
    answers: list[pb.PullResponse] = []
    offset = 0
    got = 0
    deadline = time.monotonic() + 20
    while got < count:
        assert time.monotonic() < deadline, f"only {got} of {count} messages: {answers[-3:]}"
        answer = pull(stub, topic, broker, queue_id, offset, long_poll_timeout_ms=2000, **fields)
        answers.append(answer)
        got += len(answer.messages)
        offset = answer.next_offset
    return answers


def test_produce_round_robin_spreads_over_both_brokers_and_pull_reads_everything(
    cluster: Cluster, topic_name: str
) -> None:
    """Each request's messages go to one queue (a RocketMQ batch send); successive
    requests take the topic's queues in turn."""
    cluster.create_topic(topic_name, queues=2)
    stub = cluster.gateway.stub
    bodies = [f"message {i}".encode() for i in range(40)]
    results = []
    for start in range(0, 40, 10):
        batch = produce(
            stub, *(pb.ProduceMessage(topic=topic_name, body=b) for b in bodies[start : start + 10])
        )
        assert len({(r.broker_name, r.queue_id) for r in batch}) == 1
        results.extend(batch)
    assert all(r.status == pb.ProduceResult.SEND_OK for r in results)
    assert all(len(r.msg_id) == 32 and len(r.unique_key) == 32 for r in results)
    assert len({r.unique_key for r in results}) == 40
    per_queue = Counter((r.broker_name, r.queue_id) for r in results)
    assert per_queue == {(b, q): 10 for b in ("broker-a", "broker-b") for q in (0, 1)}
    read: dict[bytes, pb.ProduceResult] = {}
    for broker, queue_id in per_queue:
        answers = pull_until(stub, topic_name, broker, queue_id, 10)
        messages = [m for a in answers for m in a.messages]
        assert [m.queue_offset for m in messages] == list(range(10))
        for message in messages:
            read[message.body] = next(r for r in results if r.msg_id == message.msg_id)
            assert message.topic == topic_name and message.queue_id == queue_id
        last = answers[-1]
        assert (last.status, last.next_offset, last.min_offset, last.max_offset) == (
            Status.FOUND,
            10,
            0,
            10,
        )
        nothing = pull(stub, topic_name, broker, queue_id, 10)
        assert (nothing.status, nothing.next_offset) == (Status.NO_NEW_MESSAGE, 10)
    assert sorted(read) == sorted(bodies)
    for body, result in read.items():
        assert bodies.index(body) == results.index(result)  # results are in request order


def test_explicit_queue_properties_keys_and_born_time(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=3)
    stub = cluster.gateway.stub
    message = pb.ProduceMessage(
        topic=topic_name,
        body=b"exact",
        tags="TagX",
        keys=["k1", "k2"],
        properties={"color": "blue"},
        queue=pb.QueueRef(broker_name="broker-b", queue_id=2),
        born_timestamp_ms=1_234_567,
        unique_key="MY-UNIQUE-KEY-1",
        flag=7,
    )
    results = produce(stub, message, message)
    assert [(r.broker_name, r.queue_id, r.queue_offset) for r in results] == [
        ("broker-b", 2, 0),
        ("broker-b", 2, 1),
    ]
    assert results[0].unique_key == "MY-UNIQUE-KEY-1"
    stored = pull_until(stub, topic_name, "broker-b", 2, 2)[0].messages[0]
    assert stored.body == b"exact" and stored.tags == "TagX" and list(stored.keys) == ["k1", "k2"]
    assert stored.properties["color"] == "blue"
    assert stored.properties["UNIQ_KEY"] == "MY-UNIQUE-KEY-1"
    assert stored.born_timestamp_ms == 1_234_567 and stored.flag == 7
    assert stored.born_host.startswith("127.0.0.1:")
    assert stored.store_host == cluster.broker("broker-b").storage_address


def test_sharding_key_sticks_to_one_queue(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=4)
    stub = cluster.gateway.stub
    keys = [f"order-{i}" for i in range(12)]
    first = produce(
        stub, *(pb.ProduceMessage(topic=topic_name, body=b"1", sharding_key=k) for k in keys)
    )
    again = produce(
        stub, *(pb.ProduceMessage(topic=topic_name, body=b"2", sharding_key=k) for k in keys * 3)
    )
    queue_of = {k: (r.broker_name, r.queue_id) for k, r in zip(keys, first, strict=True)}
    for key, result in zip(keys * 3, again, strict=True):
        assert (result.broker_name, result.queue_id) == queue_of[key]
    assert len(set(queue_of.values())) > 1  # keys spread


def test_tag_expressions_filter_by_the_real_tag(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-a"])
    stub = cluster.gateway.stub
    tags = ["A", "B", "C", "", "Aa", "BB", "A", "C"]  # "Aa" and "BB" share a hash code
    produce(
        stub, *(pb.ProduceMessage(topic=topic_name, body=t.encode() or b"-", tags=t) for t in tags)
    )

    def tags_read(expression: str) -> list[str]:
        got: list[str] = []
        offset = 0
        while offset < len(tags):
            # (A long poll: should the queue look short, the gateway waits for news.)
            answer = pull(
                stub,
                topic_name,
                "broker-a",
                0,
                offset,
                expression=expression,
                long_poll_timeout_ms=1_000,
            )
            if answer.status == Status.NO_NEW_MESSAGE:
                continue
            assert answer.status in (Status.FOUND, Status.NO_MATCHED_MESSAGE), answer
            got.extend(m.tags for m in answer.messages)
            offset = answer.next_offset
        return got

    pull_until(stub, topic_name, "broker-a", 0, len(tags))
    assert tags_read("*") == tags
    assert tags_read("") == tags
    assert tags_read("A || B") == ["A", "B", "A"]
    assert tags_read("BB") == ["BB"]
    assert tags_read("Aa ||C") == ["C", "Aa", "C"]
    none = pull(stub, topic_name, "broker-a", 0, 0, expression="Z")
    assert (none.status, none.next_offset, len(none.messages)) == (
        Status.NO_MATCHED_MESSAGE,
        len(tags),
        0,
    )


def test_long_poll_answers_soon_after_a_send(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-b"])
    stub = cluster.gateway.stub
    held = stub.Pull.future(
        pb.PullRequest(
            topic=topic_name, broker_name="broker-b", queue_id=0, long_poll_timeout_ms=10_000
        ),
        timeout=RPC_TIMEOUT_S,
    )
    cluster.gateway.wait_held(1)
    assert not held.done()
    sent = time.monotonic()
    produce(stub, pb.ProduceMessage(topic=topic_name, body=b"wake up"))
    answer: pb.PullResponse = held.result()
    waited_s = time.monotonic() - sent
    assert answer.status == Status.FOUND and answer.messages[0].body == b"wake up"
    # Woken by the arrival, not by its 10 s timeout (a margin for a loaded box).
    assert waited_s < 5.0, f"the held pull answered {waited_s:.2f} s after the send"


def test_long_poll_times_out_with_no_new_message(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-a"])
    started = time.monotonic()
    answer = pull(cluster.gateway.stub, topic_name, "broker-a", 0, long_poll_timeout_ms=1_000)
    waited_s = time.monotonic() - started
    assert (answer.status, answer.next_offset, answer.max_offset) == (Status.NO_NEW_MESSAGE, 0, 0)
    assert 0.9 <= waited_s < 15, waited_s


def test_pull_offsets_out_of_range(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-a"])
    stub = cluster.gateway.stub
    never = pull(stub, topic_name, "broker-a", 0, 5)
    assert (never.status, never.next_offset) == (Status.OFFSET_ILLEGAL, 0)
    produce(stub, *(pb.ProduceMessage(topic=topic_name, body=b"x") for _ in range(3)))
    pull_until(stub, topic_name, "broker-a", 0, 3)
    beyond = pull(stub, topic_name, "broker-a", 0, 7)
    assert (beyond.status, beyond.next_offset, beyond.min_offset, beyond.max_offset) == (
        Status.OFFSET_ILLEGAL,
        3,
        0,
        3,
    )
    part = pull(stub, topic_name, "broker-a", 0, 1, max_messages=1)
    assert (part.status, len(part.messages), part.next_offset) == (Status.FOUND, 1, 2)


def test_a_request_takes_one_queue_per_topic_on_the_general_path_too(
    cluster: Cluster, topic_name: str
) -> None:
    """Messages with tags and keys (not the plain path) and a request naming two topics:
    each topic's round-robin messages of a request share one queue, and the next request
    takes the next queue; a sharding key or an explicit queue still routes its message."""
    other = f"{topic_name}_other"
    cluster.create_topic(topic_name, queues=2)
    cluster.create_topic(other, queues=2)
    stub = cluster.gateway.stub
    queues_by_request: list[tuple[tuple[str, int], tuple[str, int]]] = []
    for request in range(4):
        results = produce(
            stub,
            *(
                pb.ProduceMessage(
                    topic=topic, body=f"{request}-{i}".encode(), tags="T", keys=[f"k{i}"]
                )
                for i in range(6)
                for topic in (topic_name, other)
            ),
            pb.ProduceMessage(
                topic=topic_name,
                body=b"explicit",
                queue=pb.QueueRef(broker_name="broker-b", queue_id=1),
            ),
        )
        assert all(r.status == pb.ProduceResult.SEND_OK for r in results)
        mine = {(r.broker_name, r.queue_id) for r in results[:-1:2]}
        theirs = {(r.broker_name, r.queue_id) for r in results[1:-1:2]}
        assert len(mine) == len(theirs) == 1
        assert (results[-1].broker_name, results[-1].queue_id) == ("broker-b", 1)
        queues_by_request.append((mine.pop(), theirs.pop()))
    assert len({mine for mine, _ in queues_by_request}) == 4  # 4 requests over 4 queues
    assert len({theirs for _, theirs in queues_by_request}) == 4


def test_query_by_msg_id_key_and_unique_key(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=2)
    stub = cluster.gateway.stub
    results = [  # one request each: successive requests rotate over the queues
        result
        for i in range(6)
        for result in produce(
            stub,
            pb.ProduceMessage(topic=topic_name, body=f"b{i}".encode(), keys=["shared", f"own-{i}"]),
        )
    ]
    assert {r.broker_name for r in results} == {"broker-a", "broker-b"}
    for result in results:
        found = stub.QueryMessage(
            pb.QueryMessageRequest(msg_id=result.msg_id), timeout=RPC_TIMEOUT_S
        )
        assert len(found.messages) == 1
        assert found.messages[0].broker_name == result.broker_name
        assert found.messages[0].message.msg_id == result.msg_id

    def by_key(key: str, **fields: int) -> list[pb.QueriedMessage]:
        request = pb.QueryMessageRequest(key=pb.KeyQuery(topic=topic_name, key=key, **fields))
        return list(stub.QueryMessage(request, timeout=RPC_TIMEOUT_S).messages)

    wait_until(lambda: len(by_key("shared")) == 6, "the index to hold every message")
    shared = by_key("shared")
    stamps = [(m.message.store_timestamp_ms) for m in shared]
    assert stamps == sorted(stamps, reverse=True)  # newest first
    assert {m.broker_name for m in shared} == {"broker-a", "broker-b"}
    assert [m.message.body for m in by_key("own-3")] == [b"b3"]
    assert len(by_key("shared", max_count=2)) == 2
    assert by_key("nobody") == []
    unique = results[4].unique_key
    found = stub.QueryMessage(
        pb.QueryMessageRequest(unique_key=pb.UniqueKeyQuery(topic=topic_name, unique_key=unique)),
        timeout=RPC_TIMEOUT_S,
    )
    assert [m.message.body for m in found.messages] == [b"b4"]


def test_queue_offsets_search_offset_and_consumer_offsets(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-b"])
    stub = cluster.gateway.stub
    topic, broker = topic_name, "broker-b"
    empty = stub.GetQueueOffsets(
        pb.QueueOffsetsRequest(topic=topic, broker_name=broker), timeout=RPC_TIMEOUT_S
    )
    assert (empty.min_offset, empty.max_offset) == (0, 0)
    results = produce(stub, *(pb.ProduceMessage(topic=topic_name, body=b"x") for _ in range(5)))
    pull_until(stub, topic_name, "broker-b", 0, 5)
    offsets = stub.GetQueueOffsets(
        pb.QueueOffsetsRequest(topic=topic, broker_name=broker), timeout=RPC_TIMEOUT_S
    )
    assert (offsets.min_offset, offsets.max_offset) == (0, 5)
    stamp = results[2].store_timestamp_ms
    found = stub.SearchOffset(
        pb.SearchQueueOffsetRequest(topic=topic, broker_name=broker, timestamp_ms=stamp),
        timeout=RPC_TIMEOUT_S,
    )
    assert 0 <= found.offset <= 2  # the first stored at or after (same-ms stores tie)
    future = stub.SearchOffset(
        pb.SearchQueueOffsetRequest(
            topic=topic, broker_name=broker, timestamp_ms=stamp + 3_600_000
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert future.offset == 5

    never = stub.GetOffset(
        pb.GetConsumerOffsetRequest(consumer_group="G1", topic=topic, broker_name=broker),
        timeout=RPC_TIMEOUT_S,
    )
    assert never.offset == -1
    stub.CommitOffset(
        pb.CommitConsumerOffsetRequest(
            consumer_group="G1", topic=topic, broker_name=broker, offset=3
        ),
        timeout=RPC_TIMEOUT_S,
    )
    got = stub.GetOffset(
        pb.GetConsumerOffsetRequest(consumer_group="G1", topic=topic, broker_name=broker),
        timeout=RPC_TIMEOUT_S,
    )
    assert got.offset == 3
    # kept by the broker's storage
    stored = cluster.broker("broker-b").storage.stub.GetOffset(
        storage_pb.GetOffsetRequest(consumer_group="G1", topic=topic_name, queue_id=0),
        timeout=RPC_TIMEOUT_S,
    )
    assert stored.offset == 3


def test_heartbeat_reaches_every_broker_and_get_consumers_merges(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=1)
    stub = cluster.gateway.stub
    group = f"G_{topic_name}"[:60]
    for client in ("c1", "c2"):
        reply = stub.Heartbeat(
            storage_pb.ConsumerHeartbeatRequest(
                consumer_group=group,
                client_id=client,
                subscriptions=[storage_pb.Subscription(topic=topic_name, expression="A || B")],
            ),
            timeout=RPC_TIMEOUT_S,
        )
        assert reply.expiry_ms > 0
    for broker in cluster.brokers:
        members = broker.storage.stub.GetConsumers(
            storage_pb.GetConsumersRequest(consumer_group=group), timeout=RPC_TIMEOUT_S
        )
        assert [m.client_id for m in members.members] == ["c1", "c2"], broker.name
    merged = stub.GetConsumers(
        storage_pb.GetConsumersRequest(consumer_group=group), timeout=RPC_TIMEOUT_S
    )
    assert [m.client_id for m in merged.members] == ["c1", "c2"]
    assert merged.members[0].subscriptions[0].expression == "A || B"
    gone = stub.UnregisterConsumer(
        storage_pb.UnregisterConsumerRequest(consumer_group=group, client_id="c1"),
        timeout=RPC_TIMEOUT_S,
    )
    assert gone.existed
    left = stub.GetConsumers(
        storage_pb.GetConsumersRequest(consumer_group=group), timeout=RPC_TIMEOUT_S
    )
    assert [m.client_id for m in left.members] == ["c2"]


def test_health_serving(cluster: Cluster) -> None:
    health = health_pb2_grpc.HealthStub(cluster.gateway.channel)
    for service in ("", "tide.v1.Gateway"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_TIMEOUT_S)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_unknown_topic_in_batch_fails_the_call(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    stub = cluster.gateway.stub
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: produce(
            stub,
            pb.ProduceMessage(topic=topic_name, body=b"ok"),
            pb.ProduceMessage(topic=f"{topic_name}_missing", body=b"x"),
        ),
        "tide topic create",
    )
