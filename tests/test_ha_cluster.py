"""Master/slave replication seen through the gateway, with real processes.

* SYNC_MASTER + SYNC_FLUSH brokers with one slave each: producers run through the gateway
  while broker-a's master is SIGKILLed; every acknowledged (SEND_OK) message is readable
  from the slave (by id, by key, by pull); a consumer group keeps consuming broker-a's
  queues from the slave while its master is down (commits fail and are kept), and goes on
  on the master after it restarts: every stored message is consumed exactly once and the
  committed offsets end at the queues' ends.
* A slave started empty copies everything and is readable through the gateway once its
  master is gone from the route.
* SYNC_MASTER's per-message statuses reach the producer (SLAVE_NOT_AVAILABLE,
  FLUSH_SLAVE_TIMEOUT).
* ``tide consume`` reads from the slave while the master is down, and failed commits do
  not stop it.
* A pull held on the slave (its master's dispatch down) is woken by the slave dispatch's
  arrivals.
* The slave's metadata sync: topics and offsets committed through the gateway are on
  the slave, and stay there after the master's SIGKILL.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._cluster import Cluster, Replica
from tide.client import (
    Admin,
    Message,
    MessageQueue,
    Producer,
    PullConsumer,
    PushConsumer,
    ReceivedMessage,
    SendResult,
    SendStatus,
    TideError,
    Unavailable,
)
from tide.v1 import dispatch_pb2 as dispatch_pb
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

WAIT_S = 90.0
QUEUES = 4
# The gateway avoids a failed master this long (produce) / reads from its slave at most
# this long (reads come back as soon as the master is connected again).
FAULT_ISOLATION_MS = 2_000
FAST_CONSUMER = {
    "heartbeat_interval_ms": 300,
    "rebalance_interval_ms": 300,
    "long_poll_timeout_ms": 2_000,
    "commit_interval_ms": 200,
    "rpc_timeout_ms": 5_000,
}


@pytest.fixture
def ha_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with Cluster(
        tmp_path,
        brokers=2,
        replicas=2,
        master_role="SYNC_MASTER",
        storage_args=("--flush", "sync"),
        gateway_args=("--fault-isolation-ms", str(FAULT_ISOLATION_MS)),
    ) as cluster:
        yield cluster


class Deliveries:
    """Every delivery (queue, queue offset, key), thread-safe; the callback can be held."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[MessageQueue, int, str]] = []
        self.open = threading.Event()
        self.open.set()

    def __call__(self, message: ReceivedMessage) -> None:
        self.open.wait(WAIT_S)
        with self.lock:
            self.items.append((message.queue, message.queue_offset, message.keys[0]))

    def keys(self) -> set[str]:
        with self.lock:
            return {key for *_, key in self.items}

    def positions(self) -> Counter[tuple[MessageQueue, int]]:
        with self.lock:
            return Counter((queue, offset) for queue, offset, _ in self.items)


class ProducerThread:
    """Sends batches of keyed messages through the gateway until stopped; records each
    message's key and result (acknowledged or not) and the send errors."""

    def __init__(self, gateway: str, topic: str, prefix: str) -> None:
        self._producer = Producer(gateway, rpc_timeout_ms=5_000)
        self._topic = topic
        self._prefix = prefix
        self.sent: list[tuple[str, SendResult]] = []
        self.errors: list[TideError] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._count = 0

    def start(self) -> ProducerThread:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            keys = [f"{self._prefix}-{self._count + i}" for i in range(8)]
            self._count += len(keys)
            try:
                results = self._producer.send_batch(
                    [Message(self._topic, b"x" * 64, keys=[key]) for key in keys]
                )
            except TideError as exc:
                self.errors.append(exc)
                time.sleep(0.05)  # pacing (a load generator), not a wait
                continue
            self.sent.extend(zip(keys, results, strict=True))
            time.sleep(0.01)  # pacing (a load generator), not a wait

    def acked(self, broker_name: str | None = None) -> list[tuple[str, SendResult]]:
        """(key, result) of the SEND_OK messages (on ``broker_name`` when given)."""
        return [
            (key, result)
            for key, result in list(self.sent)
            if result.status is SendStatus.SEND_OK
            and broker_name in (None, result.queue.broker_name)
        ]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        self._producer.close()


def committed(gateway: str, group: str, queue: MessageQueue) -> int:
    """The group's committed offset (read from the slave while the master is down)."""
    with PullConsumer(group, gateway) as consumer:
        return consumer.committed(queue)


def queue_ends(gateway: str, topic: str) -> dict[MessageQueue, int]:
    with PullConsumer("G_probe", gateway) as consumer:
        return {queue: consumer.max_offset(queue) for queue in consumer.queues(topic)}


def dispatch_caught_up(member: Replica) -> bool:
    status = member.dispatch.stub.GetStatus(dispatch_pb.GetDispatchStatusRequest(), timeout=20)
    return bool(status.lag_bytes == 0 and status.dispatched_offset > 0)


def start_group(gateway: str, topic: str, group: str, deliveries: Deliveries) -> list[PushConsumer]:
    consumers = []
    try:
        for index in range(2):
            consumers.append(
                PushConsumer(
                    group,
                    topic,
                    "*",
                    deliveries,
                    gateway,
                    consume_from="first",
                    client_id=f"member-{index}",
                    **FAST_CONSUMER,  # type: ignore[arg-type]
                ).start()
            )
    except BaseException:
        for consumer in consumers:
            consumer.shutdown()
        raise
    return consumers


def check_readable_from_the_slave(
    gateway: str, topic: str, acked_a: list[tuple[str, SendResult]]
) -> None:
    """Every acknowledged message of broker-a is read (from its slave): by id, by key, by
    pull."""
    with Admin(gateway) as admin:
        for key, result in acked_a[:: max(1, len(acked_a) // 50)]:
            found = admin.query_id(result.msg_id)
            assert (found.keys, found.queue_offset) == ((key,), result.queue_offset)
        key, result = acked_a[len(acked_a) // 2]
        assert [m.msg_id for m in admin.query_key(topic, key)] == [result.msg_id]
    with PullConsumer("G_ha_browse", gateway) as reader:
        for queue in [q for q in reader.queues(topic) if q.broker_name == "broker-a"]:
            stored = {m.queue_offset for m in reader.pull(queue, 0, 1024).messages}
            wanted = {r.queue_offset for _, r in acked_a if r.queue == queue}
            assert wanted <= stored, queue


def check_exactly_once(deliveries: Deliveries, ends: dict[MessageQueue, int]) -> None:
    """Every stored message (queue, offset) delivered exactly once."""
    positions = deliveries.positions()
    twice = [position for position, count in positions.items() if count > 1]
    assert not twice, f"delivered more than once: {twice[:10]}"
    expected = {(queue, offset) for queue, end in ends.items() for offset in range(end)}
    assert set(positions) == expected


def test_master_killed_reads_and_consumers_go_on_from_the_slave_and_back(
    ha_cluster: Cluster,
) -> None:
    cluster = ha_cluster
    gateway = cluster.gateway.listen
    topic, group = "T_ha_failover", "G_ha_failover"
    cluster.create_topic(topic, queues=QUEUES)
    broker_a = cluster.broker("broker-a")
    wait_until(
        lambda: all(b.master.storage.status().replication.slaves for b in cluster.brokers),
        "every slave connected to its master",
        timeout_s=WAIT_S,
    )
    deliveries = Deliveries()
    consumers = start_group(gateway, topic, group, deliveries)
    try:
        wait_until(
            lambda: all(len(c.assignment()) == QUEUES and not c.pending() for c in consumers),
            "the group to split the 8 queues, 4 each",
            timeout_s=WAIT_S,
        )
        # Phase 1: produce with the consumers held, so broker-a has a backlog when its
        # master dies; the master is killed while the producer runs.
        deliveries.open.clear()
        producer = ProducerThread(gateway, topic, "k").start()
        wait_until(
            lambda: len(producer.acked("broker-a")) >= 200,
            "200 acked on broker-a",
            timeout_s=WAIT_S,
        )
        on_b = len(producer.acked("broker-b"))
        broker_a.master.kill()
        wait_until(
            lambda: len(producer.acked("broker-b")) >= on_b + 40,
            "the producer going on (to broker-b) across the kill",
            timeout_s=WAIT_S,
        )
        producer.stop()
        acked = producer.acked()
        assert producer.acked("broker-b")
        check_readable_from_the_slave(gateway, topic, producer.acked("broker-a"))
        # Commits live on the master: a clear UNAVAILABLE while it is down; reads answer
        # from the slave's copy (its metadata sync), which commits cannot move meanwhile.
        queue_a0 = MessageQueue(topic, "broker-a", 0)
        with PullConsumer(group, gateway) as probe:
            with pytest.raises(Unavailable) as info:
                probe.commit(queue_a0, 0)
            assert "consumer offsets live on the master of broker-a" in str(info.value)
            on_slave = probe.committed(queue_a0)

        # Phase 2: the consumers go on, from the slave for broker-a's queues.
        deliveries.open.set()
        wait_until(
            lambda: {key for key, _ in acked} <= deliveries.keys(),
            "every acknowledged message consumed while broker-a's master is down",
            timeout_s=WAIT_S,
        )
        assert not broker_a.master.running
        assert committed(gateway, group, queue_a0) == on_slave  # still down: nothing stored

        # Phase 3: the master restarts; commits land, reads and produce go back to it.
        cluster.restart(broker_a.master)
        wait_until(
            lambda: broker_a.master.storage.status().replication.slaves,
            "the slave reconnected to the restarted master",
            timeout_s=WAIT_S,
        )
        producer = ProducerThread(gateway, topic, "after").start()
        wait_until(
            lambda: len(producer.acked("broker-a")) >= 40,
            "acked on the restarted master",
            timeout_s=WAIT_S,
        )
        producer.stop()
        acked += producer.acked()
        ends = queue_ends(gateway, topic)
        wait_until(
            lambda: len(deliveries.positions()) >= sum(ends.values()),
            "every stored message consumed",
            timeout_s=WAIT_S,
        )
        wait_until(
            lambda: all(committed(gateway, group, q) == end for q, end in ends.items()),
            "the committed offsets at the queues' ends",
            timeout_s=WAIT_S,
        )
    finally:
        for consumer in consumers:
            consumer.shutdown()
    check_exactly_once(deliveries, ends)
    assert {key for key, _ in acked} <= deliveries.keys()


def test_empty_slave_copies_everything_and_serves_reads_once_the_master_is_gone(
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path, brokers=1) as cluster:
        gateway = cluster.gateway.listen
        topic = "T_ha_empty_slave"
        cluster.create_topic(topic, queues=QUEUES)
        with Producer(gateway) as producer:
            sent = producer.send_batch(
                [Message(topic, f"m{i}", keys=[f"e-{i}"]) for i in range(400)]
            )
        assert all(r.status is SendStatus.SEND_OK for r in sent)
        broker = cluster.brokers[0]
        slave = cluster.add_slave(broker)
        end = broker.master.storage.status().max_offset
        wait_until(
            lambda: slave.storage.status().max_offset == end,
            "the slave to copy all",
            timeout_s=WAIT_S,
        )
        wait_until(
            lambda: dispatch_caught_up(slave), "the slave's dispatch to catch up", timeout_s=WAIT_S
        )

        broker.master.stop()  # unregisters: the route keeps the slave only
        wait_until(
            lambda: ("broker-a", 0) not in cluster.registered_members(),
            "the master gone from the name server",
            timeout_s=WAIT_S,
        )
        with Admin(gateway) as admin:
            for index in range(0, len(sent), 20):
                found = admin.query_id(sent[index].msg_id)
                assert (found.msg_id, found.body) == (sent[index].msg_id, f"m{index}".encode())
            assert [m.keys for m in admin.query_key(topic, "e-7")] == [("e-7",)]
        got: list[str] = []
        with PullConsumer("G_empty_slave", gateway) as reader:
            for queue in reader.queues(topic):
                assert reader.offsets(queue).min_offset == 0
                got += [m.keys[0] for m in reader.pull(queue, 0, max_messages=1024).messages]
            with pytest.raises(Unavailable) as info:
                reader.commit(MessageQueue(topic, "broker-a", 0), 1)
        assert sorted(got) == sorted(f"e-{i}" for i in range(400))
        assert "consumer offsets live on the master of broker-a" in str(info.value)
        # Produce never goes to a slave.
        with Producer(gateway) as producer, pytest.raises(Unavailable) as refused:
            producer.send(topic, b"nowhere")
        assert "live master" in str(refused.value)


def test_sync_master_statuses_reach_the_producer(tmp_path: Path) -> None:
    with Cluster(
        tmp_path,
        brokers=1,
        master_role="SYNC_MASTER",
        storage_args=("--sync-slave-timeout-ms", "300"),
    ) as cluster:
        stub = cluster.gateway.stub
        topic = "T_ha_statuses"
        cluster.create_topic(topic, queues=1)

        def produce() -> pb.ProduceResult:
            reply = stub.Produce(
                pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic, body=b"x")]),
                timeout=20,
            )
            (result,) = reply.results
            return result

        # No slave connected: written, answered at once.
        assert produce().status == pb.ProduceResult.SLAVE_NOT_AVAILABLE
        slave = cluster.add_slave(cluster.brokers[0])
        wait_until(
            lambda: produce().status == pb.ProduceResult.SEND_OK,
            "a slave in sync",
            timeout_s=WAIT_S,
        )
        # A slave that stops acknowledging: the master waits its timeout, then says so.
        os.kill(slave.storage.proc.pid, signal.SIGSTOP)
        try:
            result = produce()
        finally:
            os.kill(slave.storage.proc.pid, signal.SIGCONT)
        assert result.status == pb.ProduceResult.FLUSH_SLAVE_TIMEOUT
        with Admin(cluster.gateway.listen) as admin:
            assert admin.query_id(result.msg_id).body == b"x"  # written on the master


def test_tide_consume_reads_from_the_slave_and_keeps_going_when_commits_fail(
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path, brokers=1, replicas=2) as cluster:
        gateway = cluster.gateway.listen
        topic = "T_ha_cli"
        cluster.create_topic(topic, queues=2)
        with Producer(gateway) as producer:
            sent = producer.send_batch([Message(topic, f"c{i}") for i in range(100)])
        broker = cluster.brokers[0]
        slave = broker.slaves[0]
        end = broker.master.storage.status().max_offset
        wait_until(
            lambda: slave.storage.status().max_offset == end,
            "the slave to copy all",
            timeout_s=WAIT_S,
        )
        wait_until(
            lambda: dispatch_caught_up(slave), "the slave's dispatch to catch up", timeout_s=WAIT_S
        )
        broker.master.kill()
        command = [sys.executable, "-m", "tide.cli", "consume", "G_cli", topic]
        options = ["--from", "first", "--count", "100", "--json", "--long-poll-ms", "1000"]
        done = subprocess.run(
            [*command, *options, "--gateway", gateway],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        got = [json.loads(line)["msg_id"] for line in done.stdout.splitlines()]
        assert sorted(got) == sorted(r.msg_id for r in sent)  # the producer's ids
        assert "consumer offsets live on the master of broker-a" in done.stderr
        assert done.stderr.count("consuming goes on") <= 2  # once per queue


def test_held_pull_on_the_slave_is_woken_by_the_slaves_arrivals(tmp_path: Path) -> None:
    """The master's dispatch is down (its storage is not): pulls fail over to the slave and
    are held on the slave dispatch's arrivals, which wake them when a message produced to
    the master is replicated (the periodic recheck is pushed far out)."""
    with Cluster(
        tmp_path,
        brokers=1,
        replicas=2,
        gateway_args=("--long-poll-recheck-interval-ms", "60000"),
    ) as cluster:
        stub = cluster.gateway.stub
        topic = "T_ha_held"
        cluster.create_topic(topic, queues=1)
        broker = cluster.brokers[0]
        broker.master.dispatch.kill()
        queue = pb.QueueRef(broker_name="broker-a", queue_id=0)
        request = pb.PullRequest(
            topic=topic, broker_name="broker-a", queue_id=0, offset=0, long_poll_timeout_ms=30_000
        )
        answers: list[pb.PullResponse] = []
        started = time.monotonic()
        puller = threading.Thread(target=lambda: answers.append(stub.Pull(request, timeout=60)))
        puller.start()
        cluster.gateway.wait_held(1)
        assert not answers
        reply = stub.Produce(
            pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic, body=b"hi", queue=queue)]),
            timeout=20,
        )
        assert reply.results[0].status == pb.ProduceResult.SEND_OK
        puller.join(60)
        (answer,) = answers
        assert answer.status == pb.PullResponse.FOUND
        assert [m.body for m in answer.messages] == [b"hi"]
        assert answer.messages[0].msg_id == reply.results[0].msg_id
        assert time.monotonic() - started < 20  # woken, not the 30 s timeout


def test_slave_keeps_the_masters_topics_and_offsets_through_a_master_kill(
    tmp_path: Path,
) -> None:
    """The slave's metadata sync (RocketMQ's SlaveSynchronize) with the gateway in front:
    a topic created and offsets committed through the gateway reach the slave's tables;
    after a SIGKILL of the master the gateway pulls from the slave, and the committed
    offsets are on the slave: read from its storage directly and through the gateway
    (which reads them from the slave while the master is unreachable)."""
    with Cluster(
        tmp_path,
        brokers=1,
        replicas=2,
        storage_args=("--metadata-sync-interval-ms", "200"),
        gateway_args=("--fault-isolation-ms", str(FAULT_ISOLATION_MS)),
    ) as cluster:
        gateway = cluster.gateway.listen
        topic, group = "T_ha_metadata", "G_ha_metadata"
        cluster.create_topic(topic, queues=2)
        with Producer(gateway) as producer:
            sent = producer.send_batch([Message(topic, b"m", keys=[f"k{i}"]) for i in range(20)])
        broker = cluster.broker("broker-a")
        slave = broker.slaves[0]
        queues = sorted({result.queue for result in sent}, key=lambda q: q.queue_id)
        with PullConsumer(group, gateway) as consumer:
            for queue in queues:
                consumer.commit(queue, 1 + queue.queue_id)

        def slave_offset(queue: MessageQueue) -> int:
            request = storage_pb.GetOffsetRequest(
                consumer_group=group, topic=topic, queue_id=queue.queue_id
            )
            return int(slave.storage.stub.GetOffset(request, timeout=20).offset)

        wait_until(
            lambda: [slave_offset(q) for q in queues] == [1 + q.queue_id for q in queues],
            "the committed offsets on the slave",
            timeout_s=WAIT_S,
        )
        listed = slave.storage.stub.ListTopics(storage_pb.ListTopicsRequest(), timeout=20)
        assert topic in [t.topic_name for t in listed.topics]

        broker.master.kill()
        with PullConsumer(group, gateway) as consumer:
            pulled = [m for q in queues for m in consumer.pull(q, 0, 32).messages]
            assert sorted(m.msg_id for m in pulled) == sorted(r.msg_id for r in sent)
            assert [consumer.committed(q) for q in queues] == [1 + q.queue_id for q in queues]
        assert [slave_offset(q) for q in queues] == [1 + q.queue_id for q in queues]
        route = cluster.nameservers[0].route(topic)
        assert [q.broker_name for q in route.queue_datas] == ["broker-a"]
