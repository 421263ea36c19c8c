"""FIFO produce and orderly consumption against the normal path, in the same run.

    python -m bench.fifo_orderly                  # 20,000 messages each way
    python -m bench.fifo_orderly --count 5000 --json

Starts real processes on a fresh store (a name server, one broker: storage + dispatch,
a gateway), creates a NORMAL and a FIFO topic of ``--queues`` queues, then:

* produce: ``--count`` 128-byte messages in batches of 100 through ``tide.client``'s
  Producer, to the NORMAL topic (round robin), to the FIFO topic (each message with
  one of ``--groups`` message groups, routed by its hash and stored with
  ``__SHARDINGKEY``: a batch spread over every queue, the gateway's plain path split
  by queue since issue 21's FIFO follow-up, its general path before) and
  to a second FIFO topic in batches whose groups all hash to one queue (batch ``i`` to
  queue ``i % --queues``, as a producer batching per queue sends: the gateway's plain
  path), alternating batch by batch so that all see the same load: messages/s of each,
  the ratios FIFO / normal, and each process's CPU per message of each kind;
* consume: one PushConsumer member per topic, concurrently (default) on the NORMAL
  topic and ``orderly=True`` (queue locks, one message of a queue at a time) on the
  FIFO topic, one after the other, each from the first message: messages/s from its
  first delivery to its last (the lock wait after the storage's start, one lease of
  ``--lock-live-ms``, is before the first), and the ratio;
* pull check: ``--pulls`` unary Pulls of a locked FIFO queue at its end (no long poll)
  carrying the holder's client id (the gateway's lock check, its cached lock table)
  against the same pulls without one, alternating: pulls/s of each and the ratio.

Results go to stdout (``--json``: one JSON document).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.gateway_produce_pull import PROCESSES, free_port, loadavg, process_cpu_s, service
from tide.client import Admin, Message, Producer, PushConsumer, ReceivedMessage
from tide.client._rpc import Connection
from tide.format import sharding_key_index
from tide.v1 import gateway_pb2, storage_pb2

BROKER = "broker-a"
BATCH = 100
BODY = b"x" * 128
CONSUME_TIMEOUT_S = 600.0


def _cluster(stack: ExitStack, root: Path, lock_live_ms: int) -> str:
    namesrv = stack.enter_context(service("nameserver", ["--listen", "127.0.0.1:0"], root))
    storage_port, dispatch_port = free_port(), free_port()
    store = root / "store"
    stack.enter_context(
        service(
            "storage",
            [
                *("--listen", f"127.0.0.1:{storage_port}", "--store-dir", str(store)),
                *("--namesrv", namesrv, "--broker-name", BROKER),
                *("--dispatch-address", f"127.0.0.1:{dispatch_port}"),
                *("--rebalance-lock-max-live-time-ms", str(lock_live_ms)),
            ],
            root,
        )
    )
    stack.enter_context(
        service(
            "dispatch",
            [
                *("--listen", f"127.0.0.1:{dispatch_port}", "--store-dir", str(store)),
                *("--storage", f"127.0.0.1:{storage_port}"),
            ],
            root,
        )
    )
    return stack.enter_context(
        service("gateway", ["--listen", "127.0.0.1:0", "--namesrv", namesrv], root)
    )


def produce(
    gateway: str, count: int, groups: int, queues: int, cpu_us: dict[str, dict[str, float]]
) -> dict[str, float]:
    """Alternating batches to the three topics; messages/s of the call time of each (and
    into ``cpu_us``, each process's CPU per message of each kind, us)."""
    spent_s = {"normal": 0.0, "fifo": 0.0, "fifo_grouped": 0.0}
    cpu_spent_s: dict[str, dict[str, float]] = {kind: {} for kind in spent_s}
    names = [f"group-{i}" for i in range(groups)]
    by_queue = [
        [name for name in names if sharding_key_index(name, queues) == q] for q in range(queues)
    ]
    if not all(by_queue):
        raise RuntimeError(f"--groups {groups} leave a queue of {queues} without a group")
    with Producer(gateway) as producer:
        for start in range(0, count, BATCH):
            size = min(BATCH, count - start)
            normal = [Message("BenchNormal", BODY) for _ in range(size)]
            fifo = [
                Message("BenchFifo", BODY, sharding_key=names[(start + i) % groups])
                for i in range(size)
            ]
            sharing = by_queue[(start // BATCH) % queues]
            grouped = [
                Message("BenchFifoGrouped", BODY, sharding_key=sharing[i % len(sharing)])
                for i in range(size)
            ]
            for kind, batch in (("normal", normal), ("fifo", fifo), ("fifo_grouped", grouped)):
                cpu_before = cpu_s()
                began = time.perf_counter()
                producer.send_batch(batch)
                spent_s[kind] += time.perf_counter() - began
                for name, used_s in cpu_s().items():
                    cpu_spent_s[kind][name] = (
                        cpu_spent_s[kind].get(name, 0.0) + used_s - cpu_before[name]
                    )
    cpu_us.update(
        {
            kind: {name: round(used_s / count * 1e6, 1) for name, used_s in used.items()}
            for kind, used in cpu_spent_s.items()
        }
    )
    return {kind: count / spent for kind, spent in spent_s.items()}


def cpu_s() -> dict[str, float]:
    """CPU seconds used so far by each service process and by this client process
    (/proc/<pid>/stat: 10 ms ticks, so per batch a sample, exact over many batches)."""
    used = {name: process_cpu_s(proc.pid) for name, proc in PROCESSES.items()}
    times = os.times()
    used["client"] = times.user + times.system
    return used


def consume(gateway: str, topic: str, count: int, *, orderly: bool) -> float:
    """Messages/s of one member from its first delivery to its ``count``-th."""
    times: list[float] = []
    lock = threading.Lock()
    done = threading.Event()

    def callback(message: ReceivedMessage) -> None:
        with lock:
            times.append(time.perf_counter())
            if len(times) >= count:
                done.set()

    with PushConsumer(
        f"bench-{topic}",
        topic,
        "*",
        callback,
        gateway,
        orderly=orderly,
        consume_from="first",
        rebalance_interval_ms=500,
        lock_interval_ms=500,
    ):
        if not done.wait(CONSUME_TIMEOUT_S):
            raise RuntimeError(f"{topic}: {len(times)} of {count} consumed in time")
    return (count - 1) / (times[count - 1] - times[0])


def pull_check(gateway: str, pulls: int) -> dict[str, float]:
    """Pulls/s with and without the holder's client id (alternating)."""
    connection = Connection(gateway)
    stub = connection.stub
    lock = gateway_pb2.BrokerQueueLockRequest(
        broker_name=BROKER,
        request=storage_pb2.QueueLockRequest(
            consumer_group="bench-check",
            client_id="bench-holder",
            queues=[storage_pb2.LockedQueue(topic="BenchFifo", queue_id=0)],
        ),
    )
    if not stub.LockQueues(lock).locked:
        raise RuntimeError("queue 0 of BenchFifo not locked")
    end = stub.GetQueueOffsets(
        gateway_pb2.QueueOffsetsRequest(topic="BenchFifo", broker_name=BROKER, queue_id=0)
    ).max_offset
    spent_s = {"checked": 0.0, "plain": 0.0}
    try:
        for _ in range(pulls):
            for kind, client_id in (("checked", "bench-holder"), ("plain", "")):
                request = gateway_pb2.PullRequest(
                    consumer_group="bench-check",
                    topic="BenchFifo",
                    broker_name=BROKER,
                    queue_id=0,
                    offset=end,
                    client_id=client_id,
                )
                began = time.perf_counter()
                stub.Pull(request)
                spent_s[kind] += time.perf_counter() - began
    finally:
        stub.UnlockQueues(lock)
        connection.close()
    return {kind: pulls / spent for kind, spent in spent_s.items()}


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="tide-fifo-bench-"))
    before = loadavg()
    try:
        with ExitStack() as stack:
            gateway = _cluster(stack, root, args.lock_live_ms)
            with Admin(gateway) as admin:
                admin.create_topic("BenchNormal", read_queue_nums=args.queues)
                for fifo in ("BenchFifo", "BenchFifoGrouped"):
                    admin.create_topic(fifo, read_queue_nums=args.queues, message_type="FIFO")
            cpu_us: dict[str, dict[str, float]] = {}
            produced = produce(gateway, args.count, args.groups, args.queues, cpu_us)
            normal_rate = consume(gateway, "BenchNormal", args.count, orderly=False)
            orderly_rate = consume(gateway, "BenchFifo", args.count, orderly=True)
            checked = pull_check(gateway, args.pulls)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "loadavg": {"before": before, "after": loadavg()},
        "count": args.count,
        "queues": args.queues,
        "groups": args.groups,
        "produce_msgs_per_s": produced,
        "produce_ratio": produced["fifo"] / produced["normal"],
        "produce_grouped_ratio": produced["fifo_grouped"] / produced["normal"],
        "produce_cpu_us_per_msg": cpu_us,
        "consume_msgs_per_s": {"normal": normal_rate, "orderly": orderly_rate},
        "consume_ratio": orderly_rate / normal_rate,
        "pulls_per_s": checked,
        "pull_check_ratio": checked["checked"] / checked["plain"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000, help="messages per topic")
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--groups", type=int, default=1_000, help="message groups (FIFO)")
    parser.add_argument("--lock-live-ms", type=int, default=2_000, help="the storage's lease")
    parser.add_argument("--pulls", type=int, default=2_000, help="pulls each way (check)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    produced, consumed = result["produce_msgs_per_s"], result["consume_msgs_per_s"]
    print(f"{args.count} messages of 128 bytes, {args.queues} queues, {args.groups} groups")
    print(
        f"produce: normal {produced['normal']:,.0f}/s, FIFO {produced['fifo']:,.0f}/s "
        f"(ratio {result['produce_ratio']:.2f}), FIFO batches of one queue "
        f"{produced['fifo_grouped']:,.0f}/s (ratio {result['produce_grouped_ratio']:.2f})"
    )
    print(
        f"consume: concurrent {consumed['normal']:,.0f}/s, orderly {consumed['orderly']:,.0f}/s "
        f"(ratio {result['consume_ratio']:.2f})"
    )
    pulls = result["pulls_per_s"]
    print(
        f"pull: with the holder's client id {pulls['checked']:,.0f}/s, without "
        f"{pulls['plain']:,.0f}/s (ratio {result['pull_check_ratio']:.2f})"
    )


if __name__ == "__main__":
    main()
