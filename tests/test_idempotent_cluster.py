"""Idempotent producers through failures, on a real cluster (one broker, master + slave):

* an answer lost on the way back (a small gRPC proxy between the client and the gateway
  forwards the Produce, then drops its answer): the client's retry is answered with the
  original results, the batch is stored once;
* the broker SIGKILLed after storing a batch: after the restart the storage rebuilt its
  window (from the snapshot and the commitlog, and from the commitlog alone once the
  snapshot is deleted), and a retry is again answered with the original results;
* the slave holds the master's producer state (config/producerState.json).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from tests._cluster import Cluster, cluster_fixture
from tide.client import IdempotentProducer, Message, MessageQueue, PullConsumer
from tide.format import PRODUCER_STATE_FILE
from tide.waiting import wait_until

BROKER = "broker-a"
FORWARD_TIMEOUT_S = 20.0

cluster = cluster_fixture(
    brokers=1,
    replicas=2,
    storage_args=(
        "--metadata-sync-interval-ms",
        "200",
        "--producer-state-snapshot-interval-ms",
        "200",
    ),
)


class DroppingProxy:
    """Forwards every unary call to the gateway byte for byte; the first ``drops``
    Produce answers are dropped after the gateway gave them (the client sees
    UNAVAILABLE, as when a connection breaks before the answer arrives)."""

    def __init__(self, gateway: str, drops: int) -> None:
        self.drops = drops
        self.forwarded_produces = 0
        self._lock = threading.Lock()
        self._channel = grpc.insecure_channel(gateway)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((self,))  # type: ignore[arg-type]
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[bytes, bytes]:
        method: str = details.method
        # No serializers: the proxy passes the encoded messages through.
        forward = self._channel.unary_unary(method, None, None)

        def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
            answer: bytes = forward(request, timeout=FORWARD_TIMEOUT_S)
            if method.endswith("/Produce"):
                with self._lock:
                    self.forwarded_produces += 1
                    drop = self.drops > 0
                    self.drops -= drop
                if drop:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "answer dropped by the test proxy")
            return answer

        return grpc.unary_unary_rpc_method_handler(handle)

    def close(self) -> None:
        self._server.stop(None)
        self._channel.close()


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[DroppingProxy]:
    proxy = DroppingProxy(cluster.gateway.listen, drops=1)
    yield proxy
    proxy.close()


def batch(topic: str, queue: MessageQueue, count: int, tag: str) -> list[Message]:
    return [Message(topic, f"{tag}-{i}".encode(), queue=queue) for i in range(count)]


def bodies(cluster: Cluster, queue: MessageQueue, count: int) -> list[bytes]:
    """The queue's messages once ``count`` are dispatched."""
    cluster.wait_dispatched(queue.topic, count, queue.broker_name, queue.queue_id)
    with PullConsumer("idem-check", cluster.gateway.listen) as consumer:
        result = consumer.pull(queue, 0, max_messages=count + 10)
    return [m.body for m in result.messages]


def test_a_lost_answer_is_retried_and_stored_once(cluster: Cluster, proxy: DroppingProxy) -> None:
    topic = "IdemLostAnswer"
    cluster.create_topic(topic, queues=1)
    queue = MessageQueue(topic, BROKER, 0)
    with IdempotentProducer(f"127.0.0.1:{proxy.port}", producer_id="lost-1") as producer:
        sent = producer.send_batch(batch(topic, queue, 5, "a"))
        assert proxy.forwarded_produces == 2  # the first answer was dropped, then retried
        assert sent.duplicate  # the retry found the batch the first call stored
        assert [r.queue_offset for r in sent.results] == list(range(5))
        more = producer.send_batch(batch(topic, queue, 1, "b"))
    assert more.results[0].queue_offset == 5
    assert bodies(cluster, queue, 6) == [*(f"a-{i}".encode() for i in range(5)), b"b-0"]


def state_file(store_dir: Path) -> Path:
    return store_dir / "config" / PRODUCER_STATE_FILE


def test_the_window_survives_a_sigkill_of_the_broker(cluster: Cluster) -> None:
    topic = "IdemCrash"
    cluster.create_topic(topic, queues=1)
    queue = MessageQueue(topic, BROKER, 0)
    master = cluster.broker(BROKER).master
    with IdempotentProducer(cluster.gateway.listen, producer_id="crash-1") as producer:
        first = producer.send_batch(batch(topic, queue, 3, "a"))
        second = producer.send_batch(batch(topic, queue, 2, "b"))
        for delete_snapshot in (False, True):
            master.kill()
            if delete_snapshot:  # rebuilt from the commitlog alone
                state_file(master.storage_dir).unlink(missing_ok=True)
            cluster.restart(master)
            again = producer.send_batch(batch(topic, queue, 2, "b"), first_sequence=3)
            assert again.duplicate
            assert [r.msg_id for r in again.results] == [r.msg_id for r in second.results]
            older = producer.send_batch(batch(topic, queue, 3, "a"), first_sequence=0)
            assert [r.msg_id for r in older.results] == [r.msg_id for r in first.results]
        last = producer.send_batch(batch(topic, queue, 1, "c"))
    assert last.first_sequence == 5 and last.results[0].queue_offset == 5
    assert len(bodies(cluster, queue, 6)) == 6


def test_the_slave_has_the_producer_state(cluster: Cluster) -> None:
    topic = "IdemSlave"
    cluster.create_topic(topic, queues=1)
    queue = MessageQueue(topic, BROKER, 0)
    with IdempotentProducer(cluster.gateway.listen, producer_id="slave-1") as producer:
        producer.send_batch(batch(topic, queue, 4, "a"))
    slave = cluster.broker(BROKER).slaves[0]

    def slave_batches() -> object:
        try:
            doc = json.loads(state_file(slave.storage_dir).read_text())
        except (FileNotFoundError, ValueError):
            return None
        producer_state = doc["producers"].get("slave-1")
        return None if producer_state is None else producer_state["queues"]

    wait_until(lambda: slave_batches() is not None, "the slave has slave-1's state")
    queues = slave_batches()
    assert isinstance(queues, list) and len(queues) == 1
    queue_state = queues[0]
    assert (queue_state["topic"], queue_state["queueId"]) == (topic, 0)
    assert [(b["firstSeq"], b["lastSeq"]) for b in queue_state["batches"]] == [(0, 3)]
    # The slave keeps its master's copy as it is (it writes none of its own).
    master = cluster.broker(BROKER).master

    def same_file() -> bool:
        try:
            master_bytes = state_file(master.storage_dir).read_bytes()
            return state_file(slave.storage_dir).read_bytes() == master_bytes
        except FileNotFoundError:
            return False

    wait_until(same_file, "the slave's producerState.json is the master's")


def snapshot_producers(store_dir: Path) -> set[str]:
    try:
        return set(json.loads(state_file(store_dir).read_text())["producers"])
    except (FileNotFoundError, ValueError, KeyError):
        return set()


def test_a_sigkill_after_dirty_only_snapshots_rebuilds_every_producer(cluster: Cluster) -> None:
    """Snapshots copy only the producers changed since the last one: after a SIGKILL the
    window of every producer (those of earlier snapshots, and one changed after them) is
    rebuilt exactly: each last batch retried is answered with its original results."""
    topic = "IdemDirtySnapshots"
    cluster.create_topic(topic, queues=1)
    queue = MessageQueue(topic, BROKER, 0)
    master = cluster.broker(BROKER).master
    names = [f"dirty-{index}" for index in range(3)]
    producers = [IdempotentProducer(cluster.gateway.listen, producer_id=name) for name in names]
    try:
        last = [
            p.send_batch(batch(topic, queue, 2, f"{n}-a"))
            for p, n in zip(producers, names, strict=True)
        ]
        wait_until(
            lambda: snapshot_producers(master.storage_dir) >= set(names),
            "a snapshot holds the three producers",
        )
        last[1] = producers[1].send_batch(batch(topic, queue, 3, "dirty-1-b"))  # after it
        master.kill()
        cluster.restart(master)
        for producer, name, sent in zip(producers, names, last, strict=True):
            tag = "dirty-1-b" if name == "dirty-1" else f"{name}-a"
            again = producer.send_batch(
                batch(topic, queue, len(sent.results), tag), first_sequence=sent.first_sequence
            )
            assert again.duplicate, name
            assert [r.msg_id for r in again.results] == [r.msg_id for r in sent.results]
        after = producers[0].send_batch(batch(topic, queue, 1, "dirty-0-c"))
        assert after.first_sequence == 2 and after.results[0].queue_offset == 9
    finally:
        for producer in producers:
            producer.close()
    assert len(bodies(cluster, queue, 10)) == 10


def test_concurrent_producers_are_each_stored_once(cluster: Cluster) -> None:
    """Idempotent batches of many producers at once (the gateway coalesces them into
    shared Appends, producer_runs): each stored once, at consecutive queue offsets, and a
    retry sent while the others still send is answered with its original results."""
    topic = "IdemConcurrent"
    cluster.create_topic(topic, queues=4)
    queues = [MessageQueue(topic, BROKER, queue_id) for queue_id in range(4)]
    batches, size = 8, 5
    start = threading.Barrier(8)

    def work(index: int) -> list[list[int]]:
        queue = queues[index % 4]
        with IdempotentProducer(cluster.gateway.listen, producer_id=f"many-{index}") as producer:
            start.wait()
            sent = [
                producer.send_batch(batch(topic, queue, size, f"{index}")) for _ in range(batches)
            ]
            last = sent[-1]
            again = producer.send_batch(
                batch(topic, queue, size, f"{index}"), first_sequence=last.first_sequence
            )
            assert again.duplicate
            assert [r.msg_id for r in again.results] == [r.msg_id for r in last.results]
        return [[r.queue_offset for r in s.results] for s in sent]

    with futures.ThreadPoolExecutor(max_workers=8) as pool:
        offsets = list(pool.map(work, range(8)))
    per_queue: dict[int, list[int]] = {}
    for index, sent in enumerate(offsets):
        for batch_offsets in sent:
            assert batch_offsets == list(range(batch_offsets[0], batch_offsets[0] + size))
            per_queue.setdefault(index % 4, []).extend(batch_offsets)
    for queue_offsets in per_queue.values():  # two producers a queue, nothing twice
        assert sorted(queue_offsets) == list(range(2 * batches * size))
