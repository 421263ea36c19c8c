"""POP consumption (receive + ack) against pull + commit, in the same run (issue 20).

    python -m bench.pop_consume                   # 20,000 messages, batches of 32
    python -m bench.pop_consume --count 5000 --json

Starts real processes on a fresh store (a name server, one broker: storage + dispatch,
a gateway), creates a topic of ``--queues`` queues, produces ``--count`` 128-byte messages
(batches of 100), then consumes all of them twice, alternating batch by batch so that both
see the same load:

* POP: ``SimpleConsumer.receive(--batch)`` then ``ack_many`` of what came (group
  ``bench-pop``);
* pull: ``PullConsumer.pull(queue, offset, --batch)`` of the queues in turn, then
  ``commit`` of the queue's next offset (group ``bench-pull``);

and reports messages/s of each (call time only) and the ratio POP / pull. Every message is
consumed once by each (checked by msg id). Results go to stdout (``--json``: one document).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench.gateway_produce_pull import free_port, service
from tide.client import Admin, Message, Producer, PullConsumer, SimpleConsumer

BROKER = "broker-a"
TOPIC = "BenchPop"
PRODUCE_BATCH = 100
BODY = b"x" * 128
INVISIBLE_MS = 60_000


def _cluster(stack: ExitStack, root: Path) -> str:
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


def measure(gateway: str, count: int, batch: int) -> dict[str, Any]:
    with Producer(gateway) as producer:
        for start in range(0, count, PRODUCE_BATCH):
            size = min(PRODUCE_BATCH, count - start)
            producer.send_batch([Message(TOPIC, BODY) for _ in range(size)])
    spent_s = {"pop": 0.0, "pull": 0.0}
    seen: dict[str, set[str]] = {"pop": set(), "pull": set()}
    with (
        SimpleConsumer("bench-pop", TOPIC, gateway=gateway, await_duration_ms=0) as pop,
        PullConsumer("bench-pull", gateway) as pull,
    ):
        queues = pull.queues(TOPIC)
        offsets = {queue: 0 for queue in queues}
        turn = 0
        while len(seen["pop"]) < count or len(seen["pull"]) < count:
            if len(seen["pop"]) < count:
                began = time.perf_counter()
                received = pop.receive(batch, INVISIBLE_MS)
                if received:
                    errors = pop.ack_many(received)
                    if any(errors):
                        raise RuntimeError(f"ack failed: {next(e for e in errors if e)}")
                spent_s["pop"] += time.perf_counter() - began
                seen["pop"].update(m.msg_id for m in received)
            if len(seen["pull"]) < count:
                queue = queues[turn % len(queues)]
                turn += 1
                began = time.perf_counter()
                result = pull.pull(queue, offsets[queue], batch)
                if result.messages:
                    pull.commit(queue, result.next_offset)
                spent_s["pull"] += time.perf_counter() - began
                offsets[queue] = result.next_offset
                seen["pull"].update(m.msg_id for m in result.messages)
    rates = {kind: count / spent for kind, spent in spent_s.items()}
    return {
        "count": count,
        "batch": batch,
        "pop_msgs_per_s": round(rates["pop"]),
        "pull_msgs_per_s": round(rates["pull"]),
        "ratio_pop_to_pull": round(rates["pop"] / rates["pull"], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-bench-pop-"))
    try:
        with ExitStack() as stack:
            gateway = _cluster(stack, root)
            with Admin(gateway) as admin:
                admin.create_topic(TOPIC, read_queue_nums=args.queues)
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            result = {"started_utc": started, **measure(gateway, args.count, args.batch)}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()
