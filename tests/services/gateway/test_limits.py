"""Issue 17 points 2, 3 and 4 over real gRPC: what produce accepts is what the cluster
honours (every key indexed, every tag selectable), and a commit past a queue's max is
refused instead of making the group skip messages."""

from __future__ import annotations

import functools

import grpc

from tests._cluster import Cluster
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.limits import KEY_MAX_CHARS, KEYS_MAX_COUNT
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.waiting import wait_until

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def _produce(stub: pb_grpc.GatewayStub, *messages: pb.ProduceMessage) -> list[pb.ProduceResult]:
    reply = stub.Produce(pb.ProduceRequest(messages=list(messages)), timeout=RPC_TIMEOUT_S)
    assert all(r.status == pb.ProduceResult.SEND_OK for r in reply.results), reply
    return list(reply.results)


def _by_key(stub: pb_grpc.GatewayStub, topic: str, key: str) -> list[pb.QueriedMessage]:
    request = pb.QueryMessageRequest(key=pb.KeyQuery(topic=topic, key=key))
    return list(stub.QueryMessage(request, timeout=RPC_TIMEOUT_S).messages)


def test_more_keys_than_are_indexed_are_refused_and_every_key_taken_is_found(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-a"])
    stub = cluster.gateway.stub
    keys = [f"k{index}" for index in range(KEYS_MAX_COUNT + 36)]  # the 100 keys
    expect_error(
        INVALID,
        lambda: _produce(stub, pb.ProduceMessage(topic=topic_name, body=b"b", keys=keys)),
        "messages[0].keys has 100 entries",
        f"the limit is {KEYS_MAX_COUNT} (KEYS_MAX_COUNT)",
    )
    expect_error(
        INVALID,
        lambda: _produce(
            stub, pb.ProduceMessage(topic=topic_name, body=b"b", keys=["x" * (KEY_MAX_CHARS + 1)])
        ),
        "KEY_MAX_CHARS",
    )
    _produce(stub, pb.ProduceMessage(topic=topic_name, body=b"b", keys=keys[:KEYS_MAX_COUNT]))
    last = keys[KEYS_MAX_COUNT - 1]
    wait_until(lambda: len(_by_key(stub, topic_name, last)) == 1, f"{last} indexed")
    assert len(_by_key(stub, topic_name, "k0")) == 1
    # A key as long as produce takes can be queried (the dispatch took 32767 on query).
    long_key = "y" * KEY_MAX_CHARS
    _produce(stub, pb.ProduceMessage(topic=topic_name, body=b"long", keys=[long_key]))
    wait_until(lambda: len(_by_key(stub, topic_name, long_key)) == 1, "long key indexed")


def test_tags_no_subscription_can_select_are_refused(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-a"])
    stub = cluster.gateway.stub
    for tags, fragment in (
        ("A||B", "contains '|'"),
        ("A|B", "contains '|'"),
        ("*", "contains '*'"),
        ("  ", "blank"),
        (" A", "whitespace"),
        ("A\x7f", "control character"),
    ):
        expect_error(
            INVALID,
            functools.partial(
                _produce, stub, pb.ProduceMessage(topic=topic_name, body=b"b", tags=tags)
            ),
            "messages[0].tags",
            fragment,
        )
    # What produce takes, a subscription selects.
    (result,) = _produce(
        stub, pb.ProduceMessage(topic=topic_name, body=b"b", tags="Tag With Space")
    )
    reply = stub.Pull(
        pb.PullRequest(
            consumer_group="G",
            topic=topic_name,
            broker_name=result.broker_name,
            queue_id=result.queue_id,
            expression="Other || Tag With Space",
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert reply.status == pb.PullResponse.FOUND, reply
    assert [m.tags for m in reply.messages] == ["Tag With Space"]


def test_commit_past_the_queue_max_is_refused_with_its_min_and_max(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=1, brokers=["broker-a"])
    stub = cluster.gateway.stub
    for index in range(3):
        _produce(stub, pb.ProduceMessage(topic=topic_name, body=f"m{index}".encode()))

    def commit(offset: int) -> None:
        stub.CommitOffset(
            pb.CommitConsumerOffsetRequest(
                consumer_group="G", topic=topic_name, broker_name="broker-a", offset=offset
            ),
            timeout=RPC_TIMEOUT_S,
        )

    def committed() -> int:
        request = pb.GetConsumerOffsetRequest(
            consumer_group="G", topic=topic_name, broker_name="broker-a"
        )
        return stub.GetOffset(request, timeout=RPC_TIMEOUT_S).offset

    def served_max() -> int:
        request = pb.QueueOffsetsRequest(topic=topic_name, broker_name="broker-a", queue_id=0)
        return stub.GetQueueOffsets(request, timeout=RPC_TIMEOUT_S).max_offset

    # The refusal quotes the queue's offsets as the dispatch serves them, which follows
    # the storage's acknowledgement by a moment: wait until it serves all three.
    wait_until(lambda: served_max() == 3, "the dispatch to serve the three messages")
    expect_error(
        INVALID,
        lambda: commit(1_000_000_000),
        "offset 1000000000 is past the max offset 3 of queue 0",
        "the queue's min offset is 0, its max offset 3",
    )
    assert committed() == -1  # nothing stored: the group's next pull skips nothing
    commit(3)
    assert committed() == 3
    _produce(stub, pb.ProduceMessage(topic=topic_name, body=b"m3"))
    reply = stub.Pull(
        pb.PullRequest(
            consumer_group="G", topic=topic_name, broker_name="broker-a", offset=committed()
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert [m.body for m in reply.messages] == [b"m3"]
