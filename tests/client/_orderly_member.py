"""A child process for test_orderly_consumer.py: one orderly PushConsumer member that
records each delivery as a line ``member start_ns end_ns queue group seq`` (monotonic
clock, which is system-wide on Linux, so lines of several members compare) appended
with one write() to a shared file, so a SIGKILL loses nothing already recorded.

Usage: python -m tests.client._orderly_member GATEWAY GROUP TOPIC MEMBER RECORD_FILE
Writes TIDE_READY_FILE once it consumes; stops on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from tide.client import PushConsumer, ReceivedMessage

# Long enough that two members delivering one queue at once would overlap in time.
HOLD_S = 0.005
FAST = {
    "heartbeat_interval_ms": 300,
    "rebalance_interval_ms": 300,
    "long_poll_timeout_ms": 1_000,
    "commit_interval_ms": 200,
    "lock_interval_ms": 300,
    "consume_from": "first",
}


def main() -> None:
    gateway, group, topic, member, record = sys.argv[1:6]
    fd = os.open(record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def callback(message: ReceivedMessage) -> None:
        start_ns = time.monotonic_ns()
        time.sleep(HOLD_S)
        end_ns = time.monotonic_ns()
        group_key, seq = message.body.decode().split("/")
        queue = f"{message.queue.broker_name}:{message.queue.queue_id}"
        os.write(fd, f"{member} {start_ns} {end_ns} {queue} {group_key} {seq}\n".encode())

    with PushConsumer(group, topic, "*", callback, gateway, orderly=True, **FAST):  # type: ignore[arg-type]
        ready = os.environ.get("TIDE_READY_FILE")
        if ready:  # whole, then renamed (tide.spawn reads it once it exists)
            Path(ready + ".tmp").write_text('{"listen": ""}')
            os.replace(ready + ".tmp", ready)
        stop.wait()


if __name__ == "__main__":
    main()
