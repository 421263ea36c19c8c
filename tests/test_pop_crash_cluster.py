"""POP state survives SIGKILL of the dispatch, the storage and the gateway (issue 20):
a consumer receives and acks in a loop while each process is killed in turn and
restarted. Every message is acked in the end (nothing lost); no message is handed out
again after its ack succeeded (checkpoints and acks are in the commitlog before the
calls answer); messages received but not acked when a process died (the answer or the
ack lost) are delivered again once their invisible time passes: at-least-once, counted
and printed."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import grpc

from tests._cluster import Cluster
from tide.v1 import gateway_pb2 as pb
from tide.v1 import storage_pb2 as storage_pb
from tide.waiting import wait_until

MESSAGES = 600
BATCH = 100
RPC_TIMEOUT_S = 10.0
WAIT_S = 240.0
INVISIBLE_MS = 10_000  # the least a Receive may ask


class Loop:
    """Receive + ack until stopped; what was delivered and acked, per key."""

    def __init__(self, stub: Callable[[], object], topic: str, group: str) -> None:
        self._stub = stub
        self._topic, self._group = topic, group
        self._lock = threading.Lock()
        self.delivered: Counter[str] = Counter()
        self.acked: set[str] = set()
        self.after_ack: Counter[str] = Counter()  # deliveries of a key already acked
        # Keys of an Ack whose answer was lost (a process died): acked or not, unknown.
        self.maybe_acked: set[str] = set()
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def settled_count(self) -> int:
        with self._lock:
            return len(self.acked | self.maybe_acked)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except (grpc.RpcError, AssertionError):  # AssertionError: no gateway (restarting)
                with self._lock:
                    self.errors += 1
                self._stop.wait(0.2)  # a process is down: back off before asking again

    def _round(self) -> None:
        stub = self._stub()
        reply = stub.Receive(  # type: ignore[attr-defined]
            pb.ReceiveRequest(
                consumer_group=self._group,
                topic=self._topic,
                max_messages=16,
                invisible_duration_ms=INVISIBLE_MS,
                long_poll_timeout_ms=1_000,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        with self._lock:
            for message in reply.messages:
                key = message.message.keys[0]
                self.delivered[key] += 1
                if key in self.acked:
                    self.after_ack[key] += 1
        if not reply.messages:
            return
        try:
            answer = stub.Ack(  # type: ignore[attr-defined]
                pb.AckRequest(
                    consumer_group=self._group,
                    topic=self._topic,
                    entries=[pb.AckEntry(receipt_handle=m.receipt_handle) for m in reply.messages],
                ),
                timeout=RPC_TIMEOUT_S,
            )
        except grpc.RpcError:
            with self._lock:
                self.maybe_acked.update(m.message.keys[0] for m in reply.messages)
            raise
        with self._lock:
            for message, result in zip(reply.messages, answer.results, strict=True):
                if result.error == pb.POP_ERROR_NONE:
                    self.acked.add(message.message.keys[0])
                elif result.error == pb.POP_ERROR_UNAVAILABLE:
                    # The gateway's call to the broker failed (a timeout on a loaded box,
                    # a process down): the ack may have been written, as with a lost answer.
                    self.maybe_acked.add(message.message.keys[0])


def test_pop_state_survives_sigkill_of_each_process(tmp_path: Path) -> None:
    with Cluster(
        tmp_path,
        brokers=1,
        storage_args=("--flush", "sync"),
        dispatch_args=("--pop-revive-interval-ms", "200", "--pop-offset-flush-interval-ms", "200"),
    ) as cluster:
        topic, group = "T_pop_crash", "G_pop_crash"
        cluster.create_topic(topic, queues=2)
        keys = [f"k{i}" for i in range(MESSAGES)]
        for start in range(0, MESSAGES, BATCH):
            cluster.gateway.stub.Produce(
                pb.ProduceRequest(
                    messages=[
                        pb.ProduceMessage(topic=topic, body=b"m", keys=[key])
                        for key in keys[start : start + BATCH]
                    ]
                ),
                timeout=RPC_TIMEOUT_S,
            )
        loop = Loop(lambda: cluster.gateway.stub, topic, group)
        member = cluster.brokers[0].master

        def crash_dispatch() -> None:
            member.dispatch.kill()
            cluster.restart_dispatch(member)

        def crash_storage() -> None:  # and its dispatch: a broker crash
            member.kill()
            cluster.restart(member)

        def crash_gateway() -> None:
            cluster.restart_gateway(kill=True)

        crashes = [
            ("dispatch", crash_dispatch),
            ("storage", crash_storage),
            ("gateway", crash_gateway),
        ]
        loop.start()
        try:
            for index, (name, crash) in enumerate(crashes, start=1):
                target = index * MESSAGES // 5
                wait_until(
                    lambda target=target: loop.acked_count() >= target,  # type: ignore[misc]
                    f"{target} messages acked before the {name} crash",
                    WAIT_S,
                    state=loop.acked_count,
                )
                crash()
            wait_until(
                lambda: loop.settled_count() == MESSAGES,
                "every message acked (or its ack's answer lost)",
                WAIT_S,
                state=loop.settled_count,
            )
            # Nothing left for the group: none ready, in flight or waiting to come again.
            wait_until(
                lambda: _lag(cluster, topic, group) == (0, 0, 0),
                "the group's lag to reach zero",
                WAIT_S,
                state=lambda: _lag(cluster, topic, group),
            )
        finally:
            loop.stop()
        assert loop.acked | loop.maybe_acked == set(keys)
        assert not loop.after_ack, f"acked messages handed out again: {dict(loop.after_ack)}"
        again = sum(loop.delivered.values()) - MESSAGES
        print(
            f"{MESSAGES} messages, 3 crashes (dispatch, storage, gateway): {again} delivered "
            f"again (received, not acked when a process died), {len(loop.maybe_acked)} acks "
            f"whose answer was lost, {loop.errors} failed calls"
        )


def _lag(cluster: Cluster, topic: str, group: str) -> tuple[int, int, int]:
    lag = cluster.gateway.stub.GetGroupLag(
        pb.GetGroupLagRequest(consumer_group=group, topic=topic), timeout=RPC_TIMEOUT_S
    )
    return lag.ready, lag.inflight, lag.delayed


def test_fifo_order_survives_a_broker_sigkill(tmp_path: Path) -> None:
    """A FIFO queue with a message in flight stays blocked through a SIGKILL of the
    broker (storage and dispatch): after the restart the message in flight comes again
    first, in place, then the rest in send order. Lost: nothing here (the attempt is the
    checkpoint's; an attempt raised by an earlier in-place redelivery is memory only)."""
    with Cluster(
        tmp_path,
        brokers=1,
        storage_args=("--flush", "sync"),
        dispatch_args=("--pop-revive-interval-ms", "100"),
    ) as cluster:
        topic, group = "T_pop_fifo_crash", "G_pop_fifo_crash"
        cluster.create_topic(topic, queues=1, message_type="FIFO")
        config = storage_pb.GroupConfig(
            group_name=group, consume_enable=True, consume_message_orderly=True, retry_max_times=16
        )
        cluster.gateway.stub.CreateGroup(pb.CreateGroupRequest(group=config), timeout=RPC_TIMEOUT_S)
        bodies = [f"o{i}".encode() for i in range(5)]
        cluster.gateway.stub.Produce(
            pb.ProduceRequest(
                messages=[pb.ProduceMessage(topic=topic, body=b, sharding_key="k") for b in bodies]
            ),
            timeout=RPC_TIMEOUT_S,
        )
        cluster.wait_dispatched(topic, len(bodies))
        (first,) = _receive(cluster, topic, group)
        assert first.message.body == b"o0"
        # Due again 2 s from now (it is not acked): the checkpoint is in the revive log.
        cluster.gateway.stub.ChangeInvisibleDuration(
            pb.ChangeInvisibleDurationRequest(
                consumer_group=group,
                topic=topic,
                receipt_handle=first.receipt_handle,
                invisible_duration_ms=2_000,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        member = cluster.brokers[0].master
        member.kill()
        cluster.restart(member)
        seen: list[tuple[bytes, int]] = []

        def next_one() -> bool:
            try:
                got = _receive(cluster, topic, group)
            except grpc.RpcError:
                return False  # the broker is still starting
            for message in got:
                seen.append((message.message.body, message.delivery_attempt))
                cluster.gateway.stub.Ack(
                    pb.AckRequest(
                        consumer_group=group,
                        topic=topic,
                        entries=[pb.AckEntry(receipt_handle=message.receipt_handle)],
                    ),
                    timeout=RPC_TIMEOUT_S,
                )
            return len(seen) == len(bodies)

        wait_until(next_one, "every FIFO message received again in order", WAIT_S)
        assert [body for body, _ in seen] == bodies
        assert seen[0] == (b"o0", 2)  # in place, its second delivery


def _receive(cluster: Cluster, topic: str, group: str) -> list[pb.ReceivedMessage]:
    reply = cluster.gateway.stub.Receive(
        pb.ReceiveRequest(
            consumer_group=group,
            topic=topic,
            max_messages=1,
            invisible_duration_ms=INVISIBLE_MS,
            long_poll_timeout_ms=500,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    return list(reply.messages)
