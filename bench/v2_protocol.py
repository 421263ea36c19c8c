"""The RocketMQ 5 protocol edge against tide.v1, in the same run (issue 20).

    python -m bench.v2_protocol                          # 3 rounds of 10 s per phase
    python -m bench.v2_protocol --duration-s 3 --rounds 1   # a smoke run

Starts real processes on a fresh store (a name server, one broker: storage + dispatch,
and a gateway), creates a topic, then runs each phase for ``--duration-s`` with the same
client shape on both APIs: raw gRPC stubs, one message per call, ``--inflight`` calls in
flight, so the ratio measures the protocol edge (conversion, checks, answers), not a
client library:

* ``v1_produce``: ``tide.v1.Gateway/Produce`` of one 128-byte message with a unique key;
* ``v2_produce``: ``MessagingService/SendMessage`` of the same message (its message id);
* ``v1_receive_ack``: ``Receive`` of one message then ``Ack`` of its handle;
* ``v2_receive_ack``: ``ReceiveMessage`` of one message then ``AckMessage``.

The receive phases need POP consumption (services/gateway/pop.py): without it they are
reported as not run. Phases alternate ABCD, DCBA, ... over ``--rounds`` so that drift of
a shared box falls on each alike. Reports messages/s per phase (median over rounds),
``v2 / v1`` of the medians and of each round (its two phases back to back) for produce
and for receive+ack; also ``bench/results/v2_protocol.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path

import grpc
from google.protobuf.duration_pb2 import Duration

from bench.gateway_produce_pull import free_port, loadavg, service
from tide.rocketmq_v2 import definition_pb2 as v2
from tide.rocketmq_v2 import service_pb2 as v2s
from tide.rocketmq_v2 import service_pb2_grpc as v2_grpc
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc

BROKER = "broker-a"
TOPIC = "BenchV2"
GROUP = "BenchV2Group"
BODY = b"x" * 128
PHASES = ("v1_produce", "v2_produce", "v1_receive_ack", "v2_receive_ack")
RESULTS = Path(__file__).parent / "results" / "v2_protocol.json"
CALL_TIMEOUT_S = 30.0
INVISIBLE_MS = 60_000
RECEIVE_POLL_MS = 5_000  # the least long poll a v2 receive takes

Call = Callable[[], Awaitable[int]]


class Phases:
    """One call of each phase (messages done by it), on one channel per API."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.v1 = pb_grpc.GatewayStub(channel)
        self.v2 = v2_grpc.MessagingServiceStub(channel)
        self._ids = itertools.count()

    def _id(self) -> str:
        return f"01{next(self._ids):032X}"

    async def v1_produce(self) -> int:
        message = pb.ProduceMessage(topic=TOPIC, body=BODY, unique_key=self._id())
        await self.v1.Produce(pb.ProduceRequest(messages=[message]), timeout=CALL_TIMEOUT_S)
        return 1

    async def v2_produce(self) -> int:
        message = v2.Message(
            topic=v2.Resource(name=TOPIC),
            body=BODY,
            system_properties=v2.SystemProperties(message_id=self._id(), message_type=v2.NORMAL),
        )
        reply = await self.v2.SendMessage(
            v2s.SendMessageRequest(messages=[message]), timeout=CALL_TIMEOUT_S
        )
        assert reply.status.code == v2.OK, reply.status
        return 1

    async def v1_receive_ack(self) -> int:
        received = await self.v1.Receive(
            pb.ReceiveRequest(
                consumer_group=GROUP,
                topic=TOPIC,
                max_messages=1,
                invisible_duration_ms=INVISIBLE_MS,
                long_poll_timeout_ms=RECEIVE_POLL_MS,
            ),
            timeout=CALL_TIMEOUT_S,
        )
        if not received.messages:
            return 0
        entries = [pb.AckEntry(receipt_handle=m.receipt_handle) for m in received.messages]
        await self.v1.Ack(
            pb.AckRequest(consumer_group=GROUP, topic=TOPIC, entries=entries),
            timeout=CALL_TIMEOUT_S,
        )
        return len(entries)

    async def v2_receive_ack(self) -> int:
        request = v2s.ReceiveMessageRequest(
            group=v2.Resource(name=GROUP),
            message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC)),
            batch_size=1,
            invisible_duration=Duration(seconds=INVISIBLE_MS // 1000),
            long_polling_timeout=Duration(seconds=RECEIVE_POLL_MS // 1000),
        )
        entries = []
        async for answer in self.v2.ReceiveMessage(request, timeout=CALL_TIMEOUT_S):
            if answer.HasField("message"):
                system = answer.message.system_properties
                entries.append(
                    v2s.AckMessageEntry(
                        message_id=system.message_id, receipt_handle=system.receipt_handle
                    )
                )
        if not entries:
            return 0
        reply = await self.v2.AckMessage(
            v2s.AckMessageRequest(
                group=v2.Resource(name=GROUP), topic=v2.Resource(name=TOPIC), entries=entries
            ),
            timeout=CALL_TIMEOUT_S,
        )
        assert reply.status.code == v2.OK, reply.status
        return len(entries)


async def phase_rate(call: Call, inflight: int, duration_s: float) -> float:
    """Messages/s of ``call`` with ``inflight`` calls in flight for ``duration_s``."""
    deadline = time.monotonic() + duration_s
    done = [0] * inflight

    async def worker(index: int) -> None:
        while time.monotonic() < deadline:
            done[index] += await call()

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(inflight)))
    return sum(done) / (time.monotonic() - started)


async def pop_available(phases: Phases) -> bool:
    try:
        await phases.v1_receive_ack()
    except grpc.aio.AioRpcError as exc:
        if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
            return False
        raise
    return True


async def run(gateway: str, args: argparse.Namespace) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {phase: [] for phase in PHASES}
    async with grpc.aio.insecure_channel(gateway) as channel:
        phases = Phases(channel)
        await phases.v1.CreateTopic(
            pb.CreateTopicRequest(
                topic=TOPIC, read_queue_nums=args.queues, write_queue_nums=args.queues
            ),
            timeout=CALL_TIMEOUT_S,
        )
        await phase_rate(phases.v1_produce, args.inflight, 2.0)  # warm up (and fill)
        wanted = PHASES if await pop_available(phases) else PHASES[:2]
        for round_index in range(args.rounds):
            order = wanted if round_index % 2 == 0 else tuple(reversed(wanted))
            for phase in order:
                rate = await phase_rate(getattr(phases, phase), args.inflight, args.duration_s)
                rates[phase].append(rate)
                print(f"round {round_index + 1} {phase}: {rate:,.0f} msg/s", flush=True)
    return rates


def _cluster(stack: ExitStack, root: Path) -> str:
    namesrv = stack.enter_context(service("nameserver", ["--listen", "127.0.0.1:0"], root))
    storage_port, dispatch_port = free_port(), free_port()
    store = root / "store"
    storage_args = [
        "--listen",
        f"127.0.0.1:{storage_port}",
        "--store-dir",
        str(store),
        "--namesrv",
        namesrv,
        "--broker-name",
        BROKER,
        "--dispatch-address",
        f"127.0.0.1:{dispatch_port}",
    ]
    stack.enter_context(service("storage", storage_args, root))
    dispatch_args = [
        "--listen",
        f"127.0.0.1:{dispatch_port}",
        "--store-dir",
        str(store),
        "--storage",
        f"127.0.0.1:{storage_port}",
    ]
    stack.enter_context(service("dispatch", dispatch_args, root))
    return stack.enter_context(
        service("gateway", ["--listen", "127.0.0.1:0", "--namesrv", namesrv], root)
    )


def _ratio(medians: dict[str, float], kind: str) -> float | None:
    v1_rate, v2_rate = medians.get(f"v1_{kind}"), medians.get(f"v2_{kind}")
    return v2_rate / v1_rate if v1_rate and v2_rate else None


def _round_ratios(rates: dict[str, list[float]], kind: str) -> list[float]:
    """v2 / v1 of each round: the two phases ran back to back, so a box whose load drifts
    over the run weighs on both alike (more robust than the ratio of medians)."""
    return [v2 / v1 for v1, v2 in zip(rates[f"v1_{kind}"], rates[f"v2_{kind}"], strict=False) if v1]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, 11))
    parser.add_argument("--queues", type=int, default=4, choices=range(1, 65))
    parser.add_argument("--inflight", type=int, default=16, choices=range(1, 257))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-v2-bench-"))
    load_before = loadavg()
    try:
        with ExitStack() as stack:
            rates = asyncio.run(run(_cluster(stack, root), args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    medians = {phase: statistics.median(values) for phase, values in rates.items() if values}
    summary = {
        "args": vars(args),
        "rates_msg_s": rates,
        "median_msg_s": medians,
        "v2_over_v1_produce": _ratio(medians, "produce"),
        "v2_over_v1_receive_ack": _ratio(medians, "receive_ack"),
        "round_ratios_produce": _round_ratios(rates, "produce"),
        "round_ratios_receive_ack": _round_ratios(rates, "receive_ack"),
        "not_run": [phase for phase, values in rates.items() if not values],
        "loadavg": {"before": load_before, "after": loadavg()},
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
