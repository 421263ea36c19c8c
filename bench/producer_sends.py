"""The client's own cost of blocking sends from many threads (issue 21, target 6b).

16 threads each call ``Producer.send`` with one 1 KiB message, ``--sends`` times, in
this process, against a carrier that answers every accumulated call at once (no
network, no cluster): what is measured is only the client's work per send (building
the message, the accumulator, the futures, the threads' wake-ups) and the wall time,
which includes any linger the accumulator waits out. The CPU is this process's
(``os.times``); the rounds alternate nothing (one version of the client per process):
run it once per version and compare, as docs/performance.md did.

    python -m bench.producer_sends --sends 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any

from tide.client import Producer
from tide.v1 import gateway_pb2

THREADS = 16
BODY_BYTES = 1024
MSG_ID_PREFIX = "7F00000100002A9F"


def answer_at_once(
    request: gateway_pb2.ProduceRequest, what: str
) -> Future[gateway_pb2.ProduceResponse]:
    """A gateway that wrote every message of the call to one queue."""
    count = len(request.messages)
    done: Future[gateway_pb2.ProduceResponse] = Future()
    run = gateway_pb2.ProduceRun(
        first_index=0,
        count=count,
        broker_name="broker-a",
        queue_id=0,
        first_queue_offset=0,
        msg_id_prefix=MSG_ID_PREFIX,
        physical_offsets=list(range(count)),
        unique_keys=[f"u{i}" for i in range(count)],
    )
    done.set_result(gateway_pb2.ProduceResponse(runs=[run]))
    return done


def one_round(sends: int, threads: int) -> dict[str, float]:
    """CPU and wall microseconds per send, and messages per call, of one round."""
    producer = Producer("127.0.0.1:1")  # never connected: the carrier answers
    accumulator = producer._accumulator
    accumulator._carry = answer_at_once
    body = b"x" * BODY_BYTES

    def work() -> None:
        for _ in range(sends):
            producer.send("T", body)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    cpu_before, wall_before = os.times(), time.monotonic()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    cpu_after, wall_after = os.times(), time.monotonic()
    producer.close()
    total = sends * threads
    cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    return {
        "cpu_us_per_send": round(cpu_s / total * 1e6, 1),
        "wall_us_per_send": round((wall_after - wall_before) / total * 1e6, 1),
        "messages_per_call": round(accumulator.messages_sent / max(1, accumulator.calls_sent), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sends", type=int, default=1000, help="sends per thread per round")
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    rounds: list[dict[str, Any]] = [one_round(args.sends, args.threads) for _ in range(args.rounds)]
    medians = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    report = {"loadavg": list(os.getloadavg()), "rounds": rounds, "medians": medians}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
