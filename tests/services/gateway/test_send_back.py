"""SendBack and BrowseQueue through a real gateway in front of a real broker: the retry
copy in the schedule topic with its bookkeeping, the dead letter in the write-only
%DLQ% topic, the retry topic made by a heartbeat, errors, and the send-back counter.

Nothing here needs the delay delivery service: the copies are read back where the
send-back stored them (SCHEDULE_TOPIC_XXXX, %DLQ%<group>) with BrowseQueue."""

from __future__ import annotations

import time

import grpc
import pytest

from tests._cluster import Cluster, cluster_fixture
from tests._metrics import SCRAPE_INTERVAL_S, scrape, total
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.format import (
    DELAY,
    DLQ_ORIGIN_MESSAGE_ID,
    DLQ_ORIGIN_TOPIC,
    MAX_RECONSUME_TIMES,
    ORIGIN_MESSAGE_ID,
    REAL_QID,
    REAL_TOPIC,
    RECONSUME_TIME,
    RETRY_TOPIC,
    SCHEDULE_TOPIC,
    TIMER_DELIVER_MS,
    TIMER_TOPIC,
    UNIQ_KEY,
)
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1 import nameserver_pb2 as ns_pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

cluster = cluster_fixture(brokers=1)
BROKER = "broker-a"
FOUND = pb.PullResponse.Status.FOUND


def produce_one(stub: pb_grpc.GatewayStub, topic: str) -> pb.ProduceResult:
    message = pb.ProduceMessage(
        topic=topic,
        body=b"order 42",
        tags="TagA",
        keys=["order-42", "customer-7"],
        properties={"region": "eu"},
        queue=pb.QueueRef(broker_name=BROKER, queue_id=0),
    )
    reply = stub.Produce(pb.ProduceRequest(messages=[message]), timeout=RPC_TIMEOUT_S)
    return reply.results[0]


def browse_find(
    stub: pb_grpc.GatewayStub, topic: str, queue_id: int, match: str
) -> storage_pb.StoredMessage:
    """The message of (topic, queue) whose ORIGIN/DLQ msg id property or own id is
    ``match``, waiting until the dispatch has it (BrowseQueue never holds)."""
    found: list[storage_pb.StoredMessage] = []

    def look() -> bool:
        offset = 0
        while True:
            try:
                answer = stub.BrowseQueue(
                    pb.PullRequest(
                        topic=topic, broker_name=BROKER, queue_id=queue_id, offset=offset
                    ),
                    timeout=RPC_TIMEOUT_S,
                )
            except grpc.RpcError as exc:  # a topic just created: its route comes soon
                if exc.code() is grpc.StatusCode.NOT_FOUND:
                    return False
                raise
            for message in answer.messages:
                ids = {message.msg_id, message.properties.get(ORIGIN_MESSAGE_ID, "")}
                if match in ids:
                    found.append(message)
                    return True
            if answer.next_offset <= offset or answer.next_offset >= answer.max_offset:
                return False
            offset = answer.next_offset

    wait_until(look, f"{match} in {topic} queue {queue_id}")
    return found[0]


def send_back(
    stub: pb_grpc.GatewayStub, group: str, msg_id: str, **fields: int
) -> pb.SendBackResponse:
    request = pb.SendBackRequest(consumer_group=group, broker_name=BROKER, msg_id=msg_id, **fields)
    answer: pb.SendBackResponse = stub.SendBack(request, timeout=RPC_TIMEOUT_S)
    return answer


def test_send_back_stores_the_retry_copy_in_the_schedule_topic(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=1)
    stub = cluster.gateway.stub
    sent = produce_one(stub, topic_name)

    answer = send_back(stub, "G_retry_copy", sent.msg_id)

    assert answer.topic == "%RETRY%G_retry_copy"
    assert not answer.dead_lettered
    assert answer.reconsume_times == 1
    assert answer.deliver_at_ms > 0
    # RocketMQ 4's policy: attempt 1 waits level 3 (queue 2 of the schedule topic).
    copy = browse_find(stub, SCHEDULE_TOPIC, 2, sent.msg_id)
    assert copy.msg_id == answer.msg_id
    assert copy.reconsume_times == 1
    assert copy.body == b"order 42"
    assert copy.tags == "TagA"
    assert list(copy.keys) == ["order-42", "customer-7"]
    props = copy.properties
    assert props["region"] == "eu"
    assert props[UNIQ_KEY] == sent.unique_key
    assert props[DELAY] == "3"
    assert props[REAL_TOPIC] == "%RETRY%G_retry_copy"
    assert props[REAL_QID] == "0"  # the retry topic has 1 queue by default
    assert props[RETRY_TOPIC] == topic_name
    assert props[ORIGIN_MESSAGE_ID] == sent.msg_id
    assert props[RECONSUME_TIME] == "1"
    assert props[MAX_RECONSUME_TIMES] == "16"
    # The delivery is due one level-3 delay (10 s) after the copy was stored.
    assert answer.deliver_at_ms == copy.store_timestamp_ms + 10_000


def test_past_the_maximum_the_message_is_dead_lettered(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    stub = cluster.gateway.stub
    sent = produce_one(stub, topic_name)
    group = "G_dead_letters"
    first = send_back(stub, group, sent.msg_id)
    retry = browse_find(stub, SCHEDULE_TOPIC, 2, sent.msg_id)
    assert retry.msg_id == first.msg_id

    # The retry copy was reconsumed once; a maximum of 1 dead-letters it.
    answer = send_back(stub, group, retry.msg_id, max_reconsume_times=1)

    assert answer.dead_lettered
    assert answer.topic == "%DLQ%G_dead_letters"
    assert answer.reconsume_times == 2
    assert answer.deliver_at_ms == 0
    dead = browse_find(stub, "%DLQ%G_dead_letters", 0, sent.msg_id)
    assert dead.msg_id == answer.msg_id
    props = dead.properties
    assert props[DLQ_ORIGIN_TOPIC] == topic_name
    assert props[DLQ_ORIGIN_MESSAGE_ID] == sent.msg_id
    assert props[RETRY_TOPIC] == topic_name
    assert props[UNIQ_KEY] == sent.unique_key
    assert DELAY not in props and REAL_TOPIC not in props
    assert dead.body == b"order 42" and list(dead.keys) == ["order-42", "customer-7"]
    # The dead-letter topic: 1 queue, write-only (perm 2), so consumers cannot pull it.
    route: ns_pb.TopicRoute = stub.GetTopicRoute(
        ns_pb.GetTopicRouteRequest(topic="%DLQ%G_dead_letters"), timeout=RPC_TIMEOUT_S
    )
    (data,) = route.queue_datas
    assert (data.read_queue_nums, data.write_queue_nums, data.perm) == (1, 1, 2)
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: stub.Pull(
            pb.PullRequest(
                consumer_group=group, topic="%DLQ%G_dead_letters", broker_name=BROKER, queue_id=0
            ),
            timeout=RPC_TIMEOUT_S,
        ),
        "not readable",
    )


def test_delay_level_minus_one_dead_letters_at_once(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    stub = cluster.gateway.stub
    sent = produce_one(stub, topic_name)

    answer = send_back(stub, "G_at_once", sent.msg_id, delay_level=-1)

    assert answer.dead_lettered and answer.reconsume_times == 1
    dead = browse_find(stub, "%DLQ%G_at_once", 0, sent.msg_id)
    assert dead.properties[DLQ_ORIGIN_MESSAGE_ID] == sent.msg_id


def test_a_requested_delay_level_is_used(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    stub = cluster.gateway.stub
    sent = produce_one(stub, topic_name)

    answer = send_back(stub, "G_level", sent.msg_id, delay_level=1)

    copy = browse_find(stub, SCHEDULE_TOPIC, 0, sent.msg_id)
    assert copy.properties[DELAY] == "1"
    assert answer.deliver_at_ms == copy.store_timestamp_ms + 1_000


def test_send_back_errors(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    stub = cluster.gateway.stub
    sent = produce_one(stub, topic_name)
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: stub.SendBack(
            pb.SendBackRequest(consumer_group="G_e", broker_name="broker-zz", msg_id=sent.msg_id),
            timeout=RPC_TIMEOUT_S,
        ),
        "'broker-zz'",
        "broker-a",
    )
    unknown = sent.msg_id[:16] + "00000000FFFFFF00"  # same store host, an offset past the end
    expect_error(
        grpc.StatusCode.NOT_FOUND,
        lambda: send_back(stub, "G_e", unknown),
        unknown,
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: send_back(stub, "G_e", sent.msg_id, delay_level=99),
        "delay_level 99",
        "1..18",
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: send_back(stub, "G_e", sent.msg_id, delay_level=-2),
        "delay_level is -2",
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: send_back(stub, "G_e", "not-an-id"),
        "msg_id",
    )
    expect_error(
        grpc.StatusCode.INVALID_ARGUMENT,
        lambda: send_back(stub, "G_e", sent.msg_id, max_reconsume_times=1001),
        "max_reconsume_times is 1001",
    )


def test_a_heartbeat_creates_the_retry_topic(cluster: Cluster) -> None:
    stub = cluster.gateway.stub
    stub.Heartbeat(
        storage_pb.ConsumerHeartbeatRequest(
            consumer_group="G_heartbeat_retry",
            client_id="c1",
            subscriptions=[storage_pb.Subscription(topic="T_any", expression="*")],
        ),
        timeout=RPC_TIMEOUT_S,
    )

    def route() -> ns_pb.TopicRoute | None:
        try:
            answer: ns_pb.TopicRoute = stub.GetTopicRoute(
                ns_pb.GetTopicRouteRequest(topic="%RETRY%G_heartbeat_retry"),
                timeout=RPC_TIMEOUT_S,
            )
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.NOT_FOUND:
                return None
            raise
        return answer

    wait_until(route, "the retry topic's route")
    found = route()
    assert found is not None
    (data,) = found.queue_datas
    assert data.broker_name == BROKER
    assert (data.read_queue_nums, data.write_queue_nums, data.perm) == (1, 1, 6)


def test_browse_queue_never_holds(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    answer = cluster.gateway.stub.BrowseQueue(
        pb.PullRequest(
            topic=topic_name, broker_name=BROKER, queue_id=0, long_poll_timeout_ms=60_000
        ),
        timeout=5,  # far below the long poll asked for: BrowseQueue ignores it
    )
    assert answer.status == pb.PullResponse.Status.NO_NEW_MESSAGE


@pytest.mark.parametrize("outcome", ["retry", "dlq"])
def test_send_backs_are_counted_by_group_and_outcome(
    cluster: Cluster, topic_name: str, outcome: str
) -> None:
    cluster.create_topic(topic_name, queues=1)
    stub = cluster.gateway.stub
    group = f"G_counted_{outcome}"
    for _ in range(2):
        sent = produce_one(stub, topic_name)
        send_back(stub, group, sent.msg_id, delay_level=-1 if outcome == "dlq" else 0)
    address = str(cluster.gateway.ready["metrics"])
    wait_until(
        lambda: (
            total(scrape(address), "tide_gateway_send_back_total", group=group, outcome=outcome)
            == 2
        ),
        "the send-back counter",
        interval_s=SCRAPE_INTERVAL_S,
    )


def upsert_group(cluster: Cluster, config: storage_pb.GroupConfig) -> None:
    """The group's config on the broker's storage (what `tide group create` sets)."""
    cluster.brokers[0].storage.stub.UpsertGroup(
        storage_pb.UpsertGroupRequest(group=config), timeout=RPC_TIMEOUT_S
    )


def timed_send_back(
    cluster: Cluster, topic: str, group: str
) -> tuple[pb.SendBackResponse, storage_pb.StoredMessage, int, int]:
    """Produce one message and send it back; the answer, the copy filed with the timer,
    and the clock (ms) just before and after the call."""
    stub = cluster.gateway.stub
    sent = produce_one(stub, topic)
    before_ms = int(time.time() * 1000)
    answer = send_back(stub, group, sent.msg_id)
    after_ms = int(time.time() * 1000)
    copy = browse_find(stub, TIMER_TOPIC, 0, sent.msg_id)
    assert copy.msg_id == answer.msg_id
    assert copy.properties[REAL_TOPIC] == f"%RETRY%{group}"
    assert copy.properties[RETRY_TOPIC] == topic
    assert DELAY not in copy.properties
    assert int(copy.properties[TIMER_DELIVER_MS]) == answer.deliver_at_ms
    return answer, copy, before_ms, after_ms


def test_an_exponential_policy_retries_through_the_timer(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    group = "G_exponential"
    policy = storage_pb.RetryPolicy(
        type=storage_pb.RetryPolicy.EXPONENTIAL, initial_ms=2_000, max_ms=60_000, multiplier=3
    )
    upsert_group(
        cluster,
        storage_pb.GroupConfig(
            group_name=group, consume_enable=True, retry_max_times=5, retry_policy=policy
        ),
    )

    answer, copy, before_ms, after_ms = timed_send_back(cluster, topic_name, group)

    # Attempt 1 waits the initial delay from the gateway's clock, read during the call.
    assert before_ms + 2_000 <= answer.deliver_at_ms <= after_ms + 2_000
    assert copy.properties[MAX_RECONSUME_TIMES] == "5"
    # The retry copy sent back again waits initial * multiplier.
    before_ms = int(time.time() * 1000)
    again = send_back(cluster.gateway.stub, group, copy.msg_id)
    after_ms = int(time.time() * 1000)
    assert again.reconsume_times == 2
    assert before_ms + 6_000 <= again.deliver_at_ms <= after_ms + 6_000


def test_a_custom_list_retries_through_the_timer(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    group = "G_custom_list"
    policy = storage_pb.RetryPolicy(delays_ms=[1_000, 2_000, 4_000, 8_000])
    upsert_group(
        cluster,
        storage_pb.GroupConfig(
            group_name=group, consume_enable=True, retry_max_times=-1, retry_policy=policy
        ),
    )

    answer, _, before_ms, after_ms = timed_send_back(cluster, topic_name, group)

    # Attempt r waits delays_ms[r + 2] (RocketMQ 4's level 3 + r): 4 s for the first.
    assert before_ms + 4_000 <= answer.deliver_at_ms <= after_ms + 4_000


def test_group_maximum_and_consume_enable(cluster: Cluster, topic_name: str) -> None:
    cluster.create_topic(topic_name, queues=1)
    stub = cluster.gateway.stub
    upsert_group(
        cluster,
        storage_pb.GroupConfig(group_name="G_max_zero", consume_enable=True, retry_max_times=0),
    )
    sent = produce_one(stub, topic_name)
    # 0 retries: the first failure dead-letters.
    assert send_back(stub, "G_max_zero", sent.msg_id).dead_lettered
    # A request's max_reconsume_times overrides the group's.
    assert not send_back(stub, "G_max_zero", sent.msg_id, max_reconsume_times=3).dead_lettered

    upsert_group(cluster, storage_pb.GroupConfig(group_name="G_disabled", consume_enable=False))
    expect_error(
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: send_back(stub, "G_disabled", sent.msg_id),
        "consume_enable",
    )


def test_retry_queues_of_the_group_config_are_used_round_robin(
    cluster: Cluster, topic_name: str
) -> None:
    cluster.create_topic(topic_name, queues=1)
    stub = cluster.gateway.stub
    group = "G_three_retry_queues"
    upsert_group(
        cluster,
        storage_pb.GroupConfig(
            group_name=group, consume_enable=True, retry_queue_nums=3, retry_max_times=-1
        ),
    )
    stub.Heartbeat(
        storage_pb.ConsumerHeartbeatRequest(consumer_group=group, client_id="c1"),
        timeout=RPC_TIMEOUT_S,
    )
    real_queues = set()
    for _ in range(3):
        sent = produce_one(stub, topic_name)
        send_back(stub, group, sent.msg_id)
        copy = browse_find(stub, SCHEDULE_TOPIC, 2, sent.msg_id)
        real_queues.add(copy.properties[REAL_QID])
    assert real_queues == {"0", "1", "2"}
