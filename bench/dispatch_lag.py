"""Dispatch lag behind storage under a steady produce load (real processes).

    python -m bench.dispatch_lag --rate 20000 --duration-s 10

Starts a storage and a dispatch process on a fresh store (dispatch co-located, as
``tide up`` runs them), produces 128-byte messages with one key each at ``--rate``
messages/s in batches of 100, and samples the storage's max offset against the
dispatch's dispatched offset every 50 ms: the lag in bytes and in records (at the
record size). At the end it reports how long the dispatch took to catch up.

    python -m bench.dispatch_lag --latency --rate 5000 --batch 10 --duration-s 10

``--latency``: arrival latency instead. Appends of ``--batch`` messages (one queue per
append, round robin over 4) at ``--rate`` messages/s, while one thread watches
``WatchArrivals`` on the dispatch and another follows the storage's ``Tail`` itself.
For each append: send -> its bytes in a Tail chunk (the storage's share), Tail chunk ->
the arrival notice covering its last message (the dispatch's share, from the same box),
and send -> notice, as percentiles in milliseconds.
"""

from __future__ import annotations

import argparse
import bisect
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc

from tide.spawn import running
from tide.v1 import dispatch_pb2 as dpb
from tide.v1 import dispatch_pb2_grpc as dpb_grpc
from tide.v1 import storage_pb2 as spb
from tide.v1 import storage_pb2_grpc as spb_grpc

BATCH = 100
SAMPLE_INTERVAL_S = 0.05
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0
CATCH_UP_TIMEOUT_S = 120.0


@contextmanager
def service(name: str, args: list[str], run_dir: Path) -> Iterator[str]:
    ready = run_dir / f"{name}.ready"
    cmd = [sys.executable, "-m", f"services.{name}", "--listen", "127.0.0.1:0", *args]
    with running(cmd, ready, name, READY_TIMEOUT_S, stop_timeout_s=STOP_TIMEOUT_S) as process:
        yield process.listen


def percentile(values: list[int], fraction: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=20_000, help="messages/s to produce")
    parser.add_argument("--duration-s", type=float, default=10.0, help="produce for, seconds")
    parser.add_argument("--latency", action="store_true", help="arrival latency (see above)")
    parser.add_argument("--batch", type=int, default=BATCH, help="messages per append")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-lag-"))
    store = root / "store"
    try:
        with (
            service(
                "storage", ["--store-dir", str(store), "--log-level", "warning"], root
            ) as s_addr,
            service(
                "dispatch",
                ["--store-dir", str(store), "--storage", s_addr, "--log-level", "warning"],
                root,
            ) as d_addr,
        ):
            if args.latency:
                latency(s_addr, d_addr, args.rate, args.batch, args.duration_s)
            else:
                run(s_addr, d_addr, args.rate, args.duration_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(storage_addr: str, dispatch_addr: str, rate: int, duration_s: float) -> None:
    storage = spb_grpc.StorageStub(grpc.insecure_channel(storage_addr))
    dispatch = dpb_grpc.DispatchStub(grpc.insecure_channel(dispatch_addr))
    body = b"x" * 128
    lags: list[int] = []
    record_bytes = 0
    sent = 0
    start = time.monotonic()
    next_sample = start
    while (now := time.monotonic()) - start < duration_s:
        if sent < (now - start) * rate:
            request = spb.AppendRequest(
                messages=[
                    spb.Message(topic="LagTopic", queue_id=i % 4, body=body, keys=[f"k{sent + i}"])
                    for i in range(BATCH)
                ]
            )
            reply = storage.Append(request)
            record_bytes = reply.results[0].size
            sent += BATCH
        if now >= next_sample:
            status = dispatch.GetStatus(dpb.GetDispatchStatusRequest())
            lags.append(max(0, status.storage_max_offset - status.dispatched_offset))
            next_sample = now + SAMPLE_INTERVAL_S
        elif sent >= (now - start) * rate:
            time.sleep(0.001)
    produced_s = time.monotonic() - start
    end = storage.GetStatus(spb.GetStatusRequest()).max_offset
    caught_up_s = catch_up(dispatch, end)
    print(
        f"produced {sent:,} messages in {produced_s:.1f} s ({sent / produced_s:,.0f}/s), "
        f"{record_bytes} B records"
    )
    print(
        f"lag over {len(lags)} samples: p50 {percentile(lags, 0.5):,} B "
        f"({percentile(lags, 0.5) // max(1, record_bytes):,} records), "
        f"p99 {percentile(lags, 0.99):,} B, max {max(lags, default=0):,} B"
    )
    print(f"caught up {caught_up_s:.2f} s after the last append")


def latency(
    storage_addr: str, dispatch_addr: str, rate: int, batch: int, duration_s: float
) -> None:
    storage = spb_grpc.StorageStub(grpc.insecure_channel(storage_addr))
    dispatch = dpb_grpc.DispatchStub(grpc.insecure_channel(dispatch_addr))
    queues = 4
    body = b"x" * 128
    topic = spb.TopicConfig(
        topic_name="LatTopic", read_queue_nums=queues, write_queue_nums=queues, perm=6
    )
    storage.UpsertTopic(spb.UpsertTopicRequest(topic=topic), timeout=60)
    # Warm up (the topic's first records, channels) before watching.
    storage.Append(
        spb.AppendRequest(messages=[spb.Message(topic="LatTopic", queue_id=0, body=body)])
    )
    catch_up(dispatch, storage.GetStatus(spb.GetStatusRequest()).max_offset)
    start_offset = storage.GetStatus(spb.GetStatusRequest()).max_offset
    notices: list[tuple[float, int, int]] = []  # (time, queue id, max offset)
    tails: list[tuple[float, int]] = []  # (time, chunk end)
    watch = dispatch.WatchArrivals(dpb.WatchArrivalsRequest(topics=["LatTopic"]))
    tail = storage.Tail(spb.TailRequest(offset=start_offset))

    def watch_loop() -> None:
        with streams_cancelled():
            for n in watch:
                notices.append((time.monotonic(), n.queue_id, n.max_offset))

    def tail_loop() -> None:
        with streams_cancelled():
            for c in tail:
                tails.append((time.monotonic(), c.offset + len(c.data)))

    threads = [threading.Thread(target=f, daemon=True) for f in (watch_loop, tail_loop)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # both streams open
    sent: list[tuple[float, int, int, int]] = []  # (send time, queue id, last q offset, end)
    count = 0
    start = time.monotonic()
    while (now := time.monotonic()) - start < duration_s:
        due = start + count / rate
        if now < due:
            time.sleep(min(due - now, 0.002))
            continue
        queue_id = (count // batch) % queues
        request = spb.AppendRequest(
            messages=[spb.Message(topic="LatTopic", queue_id=queue_id, body=body)] * batch
        )
        sent_at = time.monotonic()
        reply = storage.Append(request)
        last = reply.results[-1]
        sent.append((sent_at, queue_id, last.queue_offset, last.physical_offset + last.size))
        count += batch
    produced_s = time.monotonic() - start
    time.sleep(0.5)
    watch.cancel()  # type: ignore[no-untyped-call]
    tail.cancel()  # type: ignore[no-untyped-call]
    print(
        f"sent {count:,} messages in {len(sent):,} appends of {batch} in {produced_s:.1f} s "
        f"({count / produced_s:,.0f}/s); {len(notices):,} notices"
    )
    report_latency(sent, notices, tails)


def report_latency(
    sent: list[tuple[float, int, int, int]],
    notices: list[tuple[float, int, int]],
    tails: list[tuple[float, int]],
) -> None:
    by_queue: dict[int, tuple[list[int], list[float]]] = {}
    for at, queue_id, max_offset in notices:
        offsets, times = by_queue.setdefault(queue_id, ([], []))
        offsets.append(max_offset)
        times.append(at)
    tail_ends = [end for _, end in tails]
    storage_ms: list[float] = []
    dispatch_ms: list[float] = []
    total_ms: list[float] = []
    missed = 0
    for sent_at, queue_id, queue_offset, end in sent:
        offsets, times = by_queue.get(queue_id, ([], []))
        i = bisect.bisect_right(offsets, queue_offset)
        j = bisect.bisect_left(tail_ends, end)
        if i == len(offsets) or j == len(tails):
            missed += 1
            continue
        total_ms.append((times[i] - sent_at) * 1000)
        storage_ms.append((tails[j][0] - sent_at) * 1000)
        dispatch_ms.append((times[i] - tails[j][0]) * 1000)
    if missed:
        print(f"  {missed} appends without a notice or Tail chunk")
    for name, values in (
        ("send -> Tail chunk (storage)", storage_ms),
        ("Tail chunk -> notice (dispatch)", dispatch_ms),
        ("send -> notice", total_ms),
    ):
        ordered = sorted(values)
        marks = (
            ", ".join(
                f"p{int(q * 100)} {ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.2f}"
                for q in (0.5, 0.9, 0.99)
            )
            if ordered
            else "-"
        )
        print(f"  {name}: {marks}, max {max(values, default=0):.2f} ms")


@contextmanager
def streams_cancelled() -> Iterator[None]:
    """A stream-reading loop ends when its call is cancelled."""
    try:
        yield
    except grpc.RpcError as exc:
        if exc.code() is not grpc.StatusCode.CANCELLED:
            raise


def catch_up(dispatch: dpb_grpc.DispatchStub, end: int) -> float:
    start = time.monotonic()
    while time.monotonic() - start < CATCH_UP_TIMEOUT_S:
        if dispatch.GetStatus(dpb.GetDispatchStatusRequest()).dispatched_offset >= end:
            return time.monotonic() - start
        time.sleep(0.01)
    raise RuntimeError(f"dispatch did not catch up within {CATCH_UP_TIMEOUT_S} s")


if __name__ == "__main__":
    main()
