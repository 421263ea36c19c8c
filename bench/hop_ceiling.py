"""The hop ceiling: what bare gRPC relays laid out as Tide's services carry on this machine.

Tide's throughput target is stated as a ratio to a bare gRPC echo of ``Gateway/Produce``
(``tide bench baseline``): one hop, no work. A message through Tide crosses more hops
than that, each a gRPC stream message or call in Python on both of its ends. This
benchmark measures what those hops alone carry, with no storage work at all, so a
target can be checked against what the process layout itself allows:

* ``echo``: the producers against ``tide.bench._echo`` (the ``tide bench`` baseline).
* ``chain``: the producers against a relay ``gateway`` that forwards every request's bytes
  over one long-lived ``Append`` stream to a ``storage`` (one append in flight, requests
  arriving meanwhile joined into the next, as Tide's gateway coalesces), and answers
  each request as the echo does once its append came back. The storage acks and pushes
  what it appended on a ``Tail`` stream to a ``dispatch`` (pending appends joined into
  one message), which pushes each chunk on a ``Watch`` stream to the gateway: Tide's
  hops, each process doing nothing but move the bytes.
* ``chain-consume``: the same with a consumer long-polling the gateway's ``Pull`` for the
  chunks, which the gateway deals round robin to ``--queues`` queues (the consumer keeps
  a pull in flight on each; up to ``--pull-batch`` messages rounded up to whole batches
  a call, and with ``--pull-batch-max`` twice as many after a full answer, up to it),
  as Tide's consumers do while producers run; with ``--pull-min`` and
  ``--pull-min-wait-ms`` the gateway holds a pull until that many messages (whole
  batches) are there or the wait ends, as Tide's fuller pulls (a Pull's ``min_messages``
  and ``min_messages_wait_ms``) do. Each request carries its send time in its
  first body (bodies of 8 bytes or more), so the consumer reports the end-to-end latency
  of each request (``e2e_p50_ms`` / ``e2e_p99_ms``), as ``tide bench`` does for Tide's.

Nothing is parsed, checked, encoded, stored or indexed, and the consumer reads one stream
of chunks instead of one queue at a time: every simplification favours the chain, so its
rate is an upper bound for any implementation with these hops in Python gRPC here.

``python -m bench.hop_ceiling`` runs the cases (one fresh set of processes each) and
prints their rates, the ratio of each to the echo and the CPU each process used;
``--json-out FILE`` writes the whole result. The producers and the consumer run in the
main process (one asyncio loop), as ``tide bench``'s do by default. With ``--address``
the client alone runs one case against relays already up there (started by
:func:`relays`, as ``bench.interleave`` does): each result then has the client's CPU
only, and every result says when its window was (``window_monotonic_s``, the system's
monotonic clock, so another process can take its CPU over the same window).

The relays and the echo run on the event loop Tide's services run on by default
(uvloop: their ``--event-loop``), so the ceiling is the limit of the same runtime;
``--event-loop asyncio`` runs them on the standard library's loop.

``--storage-writes`` has the storage relay also do what storing an append takes at the
least: its bytes copied into a memory-mapped segment file (1 GiB segments, files in a
temporary directory removed after the run) and made durable by an ``fdatasync`` every
500 ms from a thread, as Tide's ``--flush async`` does with its defaults. No format,
check or index: the cost of the page cache's fresh pages and of writing them back, which
the bare relay does not pay and Tide's storage must (docs/performance.md "A ceiling
that stores").

``--dispatch-in-storage`` drops the dispatch relay: the gateway watches the appends on
the storage relay itself (one hop fewer, what the dispatch running inside the storage's
process would save: RocketMQ's own layout, where the ReputMessageService runs in the
broker; Tide's layout keeps them apart).

A consumer first asks for the newest chunk (a pull of sequence -1 answers at once with
it and no batches) and reads what comes after, as ``tide bench``'s consumers start at
the queues' ends: against relays that carried earlier runs it does not read their
chunks, and against fresh relays it changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tide.bench._echo import _Echo, write_ready
from tide.bench._run import process_cpu_s, server_process
from tide.server import EVENT_LOOPS, run_on
from tide.v1 import gateway_pb2 as pb

CASES = ("echo", "chain", "chain-consume")
RELAY = "tide.bench.HopCeiling"
CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 128 << 20),
    ("grpc.max_send_message_length", 128 << 20),
]
COUNT = struct.Struct(">I")  # batches in a Tail chunk or a Pull answer; a queue's number
SEQUENCE = struct.Struct(">q")  # the last chunk of the queue the puller has
STAMP = struct.Struct(">q")  # a request's send time (perf_counter_ns), in its first body
STAMP_MARK = b"\xa5" * STAMP.size  # where the stamp goes in the prebuilt request
PULL_TAIL = struct.Struct(">II")  # a Pull's queue and the batches it asks for at most
NEWEST = -1  # a Pull's sequence asking where the queue ends (answered at once, no batches)
MAX_BUFFERED_CHUNK_BYTES = 256 << 20  # the gateway's chunks kept for Pull
MAX_JOINED_BYTES = 4 << 20  # at most this much joined into one append or Tail message
MAX_QUEUED_BLOBS = 100_000  # a Tail follower or watcher further behind ends the run
PULL_TIMEOUT_S = 2.0
# a relay answers the consumers' first pull (where each queue ends) at once; this only
# bounds one that never does (relays just started on a loaded box may take seconds)
POSITION_TIMEOUT_S = 30.0
# (lowest, highest) of each client option: a run stays bounded in size and time.
LIMITS: dict[str, tuple[float, float]] = {
    "message_size": (1, 4 << 20),
    "batch": (1, 1024),
    "producers": (1, 16),
    "inflight": (1, 64),
    "rate": (0, 10_000_000),
    "pull_batch": (1, 1024),
    "pull_batch_max": (0, 1024),
    "pull_min": (0, 1024),
    "pull_min_wait_ms": (0, 30_000),
    "queues": (1, 64),
    "warmup_s": (0, 60),
    "duration_s": (0.1, 600),
    "rounds": (1, 10),
}


# -- the relays --------------------------------------------------------------------------


class _FanOut:
    """What one side receives, pushed to each open stream of the other (the ``stream``
    handler; with ``join`` what waits goes as one chunk): a bounded queue each (one
    :data:`MAX_QUEUED_BLOBS` behind ends the run)."""

    def __init__(self, *, join: bool) -> None:
        self.join = join
        self.queues: list[asyncio.Queue[bytes]] = []

    def push(self, blob: bytes) -> None:
        for queue in self.queues:
            try:
                queue.put_nowait(blob)
            except asyncio.QueueFull:
                raise RuntimeError(f"a follower is {queue.qsize()} messages behind") from None

    async def stream(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any] | None
    ) -> AsyncGenerator[bytes, None]:
        """The blobs pushed from now on."""
        join = self.join
        queue: asyncio.Queue[bytes] = asyncio.Queue(MAX_QUEUED_BLOBS)
        self.queues.append(queue)
        try:
            while True:
                blob = await queue.get()
                yield _joined(blob, queue) if join else blob
        finally:
            self.queues.remove(queue)


# --storage-writes: Tide's storage defaults (--segment-size-bytes, --flush-interval-ms).
SEGMENT_BYTES = 1 << 30
FLUSH_INTERVAL_S = 0.5


class _SegmentLog:
    """The least a store does with an append: its bytes copied into a memory-mapped
    segment file, made durable by an ``fdatasync`` every ``FLUSH_INTERVAL_S`` from a
    thread (which releases the GIL, as Tide's flush thread does). Segments of
    ``SEGMENT_BYTES``, the next one created when an append does not fit."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()  # the segments' list, between writer and flusher
        self._segments: list[tuple[int, mmap.mmap]] = []
        self._position = SEGMENT_BYTES  # (the first write creates the first segment)
        self._closed = threading.Event()
        self._flusher = threading.Thread(target=self._flush, name="relay.flush", daemon=True)
        self._flusher.start()

    def close(self) -> None:
        """Stop the flush thread and close the segments (a relay is killed instead)."""
        self._closed.set()
        self._flusher.join()
        for fd, mapped in self._segments:
            mapped.close()
            os.close(fd)

    def write(self, blob: bytes) -> None:
        if len(blob) > SEGMENT_BYTES:
            raise ValueError(f"an append of {len(blob)} bytes does not fit a segment")
        if self._position + len(blob) > SEGMENT_BYTES:
            self._next_segment()
        mapped = self._segments[-1][1]
        mapped[self._position : self._position + len(blob)] = blob
        self._position += len(blob)

    def _next_segment(self) -> None:
        path = self.directory / f"{len(self._segments) * SEGMENT_BYTES:020d}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, SEGMENT_BYTES)
        with self._lock:
            self._segments.append((fd, mmap.mmap(fd, SEGMENT_BYTES)))
        self._position = 0

    def _flush(self) -> None:
        while not self._closed.wait(FLUSH_INTERVAL_S):
            with self._lock:
                fds = [fd for fd, _ in self._segments[-2:]]  # (the last one rolled from)
            for fd in fds:
                os.fdatasync(fd)


class _Storage:
    """``Append``: ack every message (with ``log``, once its bytes are in the log);
    ``Tail`` (``followers.stream``): push what was appended to each follower, what waits
    joined into one message."""

    def __init__(self, log: _SegmentLog | None = None) -> None:
        self.followers = _FanOut(join=True)
        self.log = log

    async def append(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        log = self.log
        async for blob in requests:
            if log is not None:
                log.write(blob)
            self.followers.push(blob)
            yield b"\x08\x01"


def _joined(first: bytes, queue: asyncio.Queue[bytes]) -> bytes:
    """``first`` and what else waits in ``queue`` as one chunk: its count of appended
    blobs (an append's first 4 bytes count its batches), then the blobs."""
    blobs = [first]
    size = len(first)
    while not queue.empty() and size < MAX_JOINED_BYTES:
        blob = queue.get_nowait()
        blobs.append(blob)
        size += len(blob)
    batches = sum(COUNT.unpack_from(blob)[0] for blob in blobs)
    return COUNT.pack(batches) + b"".join(blob[COUNT.size :] for blob in blobs)


class _Dispatch:
    """Follows the storage's ``Tail``; ``Watch`` (``watchers.stream``) pushes each chunk
    to each watcher."""

    def __init__(self, storage: str) -> None:
        self.storage = storage
        self.watchers = _FanOut(join=False)

    async def follow(self) -> None:
        async with grpc.aio.insecure_channel(self.storage, options=CHANNEL_OPTIONS) as channel:
            tail = channel.unary_stream(f"/{RELAY}/Tail", None, None)
            async for chunk in tail(b""):
                self.watchers.push(chunk)


@dataclass
class _Chunks:
    """The chunks the dispatch pushed, numbered from 1, for long-polling pulls."""

    first_sequence: int = 1
    chunks: deque[tuple[int, bytes]] = field(default_factory=deque)  # (batches, bytes)
    size_bytes: int = 0
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, chunk: bytes) -> None:
        self.chunks.append((COUNT.unpack_from(chunk)[0], chunk))
        self.size_bytes += len(chunk)
        while self.size_bytes > MAX_BUFFERED_CHUNK_BYTES:
            self.size_bytes -= len(self.chunks.popleft()[1])
            self.first_sequence += 1
        self.arrived.set()
        self.arrived = asyncio.Event()

    @property
    def last_sequence(self) -> int:
        """The newest chunk's number (0 before the first)."""
        return self.first_sequence - 1 + len(self.chunks)

    def after(self, sequence: int, max_batches: int) -> tuple[int, int, list[bytes]]:
        """(last sequence, batches, chunks) after ``sequence``, at least one chunk and up
        to ``max_batches`` batches when there is one."""
        if sequence + 1 < self.first_sequence:
            raise RuntimeError(f"chunk {sequence + 1} already dropped: the consumer fell behind")
        index = sequence + 1 - self.first_sequence
        taken: list[bytes] = []
        batches = 0
        while index < len(self.chunks) and (not taken or batches < max_batches):
            count, chunk = self.chunks[index]
            taken.append(chunk[COUNT.size :])
            batches += count
            index += 1
        return sequence + len(taken), batches, taken


@dataclass(frozen=True)
class _Fill:
    """A pull waits for ``batches`` (whole batches) up to ``wait_s``: fuller pulls."""

    batches: int
    wait_s: float


class _Gateway:
    """``ProduceStream`` relayed to the storage with coalesced appends; ``Pull`` from the
    chunks the dispatch pushed."""

    def __init__(
        self, storage: str, dispatch: str, max_pull_batches: int, queues: int, fill: _Fill
    ) -> None:
        self.storage = storage
        self.dispatch = dispatch
        self.max_pull_batches = max_pull_batches
        self.fill = fill
        self.echo = _Echo()
        self.pending: list[tuple[bytes, asyncio.Future[None]]] = []
        self.wake = asyncio.Event()
        self.queues = [_Chunks() for _ in range(queues)]

    async def run_appends(self) -> None:
        """One append in flight; whatever arrived meanwhile goes in the next one."""
        async with grpc.aio.insecure_channel(self.storage, options=CHANNEL_OPTIONS) as channel:
            call = channel.stream_stream(f"/{RELAY}/Append", None, None)()  # type: ignore[call-arg]
            while True:
                await self.wake.wait()
                self.wake.clear()
                batch, self.pending = self.pending, []
                if not batch:
                    continue
                blob = COUNT.pack(len(batch)) + b"".join(raw for raw, _ in batch)
                await call.write(blob)
                await call.read()
                for _, done in batch:
                    # a client that went away cancelled its requests' waits (the relays
                    # outlive their clients with ``--address``)
                    if not done.done():
                        done.set_result(None)

    async def run_watch(self) -> None:
        async with grpc.aio.insecure_channel(self.dispatch, options=CHANNEL_OPTIONS) as channel:
            watch = channel.unary_stream(f"/{RELAY}/Watch", None, None)
            queues = self.queues
            index = 0
            async for chunk in watch(b""):
                queues[index % len(queues)].add(chunk)
                index += 1

    async def produce_stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        """Answered in order, as Tide's gateway answers them (and as the echo builds it)."""
        loop = asyncio.get_running_loop()
        # at most the requests the client keeps in flight (--inflight, 64 at most)
        waiting: asyncio.Queue[tuple[bytes, asyncio.Future[None]] | None] = asyncio.Queue()

        async def read() -> None:
            async for raw in requests:
                done: asyncio.Future[None] = loop.create_future()
                self.pending.append((raw, done))
                self.wake.set()
                waiting.put_nowait((raw, done))
            waiting.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await waiting.get()) is not None:
                raw, done = item
                await done
                answer = await self.echo.produce(pb.ProduceRequest.FromString(raw), context)
                yield pb.ProduceStreamResponse(response=answer).SerializeToString()
        finally:
            reader.cancel()

    async def pull(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        (sequence,) = SEQUENCE.unpack_from(request)
        queue, asked = PULL_TAIL.unpack_from(request, SEQUENCE.size)
        chunks = self.queues[queue]
        if sequence == NEWEST:
            return SEQUENCE.pack(chunks.last_sequence) + COUNT.pack(0)
        max_batches = min(asked, self.max_pull_batches)
        last, batches, taken = chunks.after(sequence, max_batches)
        want = min(self.fill.batches, max_batches)
        if batches < want and self.fill.wait_s > 0:
            deadline = time.monotonic() + self.fill.wait_s
            while batches < want and (left_s := deadline - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(chunks.arrived.wait(), left_s)
                last, batches, taken = chunks.after(sequence, max_batches)
        if not taken:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(chunks.arrived.wait(), PULL_TIMEOUT_S)
            last, batches, taken = chunks.after(sequence, max_batches)
        return SEQUENCE.pack(last) + COUNT.pack(batches) + b"".join(taken)


async def _serve(role: str, ready: Path, args: argparse.Namespace) -> None:
    server = grpc.aio.server(options=CHANNEL_OPTIONS)
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    background: list[asyncio.Task[None]] = []
    if role == "storage":
        storage = _Storage(_SegmentLog(args.store_dir) if args.store_dir else None)
        handlers["Append"] = grpc.stream_stream_rpc_method_handler(storage.append)
        handlers["Tail"] = grpc.unary_stream_rpc_method_handler(storage.followers.stream)
        # --dispatch-in-storage: the gateway watches here, the appends joined as the Tail's
        handlers["Watch"] = grpc.unary_stream_rpc_method_handler(storage.followers.stream)
    elif role == "dispatch":
        dispatch = _Dispatch(args.storage)
        handlers["Watch"] = grpc.unary_stream_rpc_method_handler(dispatch.watchers.stream)
        background.append(asyncio.create_task(dispatch.follow()))
    else:
        fill = _Fill(args.pull_min_batches, args.pull_min_wait_ms / 1000)
        gateway = _Gateway(args.storage, args.dispatch, args.max_pull_batches, args.queues, fill)
        handlers["ProduceStream"] = grpc.stream_stream_rpc_method_handler(gateway.produce_stream)
        handlers["Pull"] = grpc.unary_unary_rpc_method_handler(gateway.pull)
        background += [
            asyncio.create_task(gateway.run_appends()),
            asyncio.create_task(gateway.run_watch()),
        ]
    for task in background:
        task.add_done_callback(_exit_on_failure)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(RELAY, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    write_ready(ready, port)
    await server.wait_for_termination()
    for task in background:
        task.cancel()


def _exit_on_failure(task: asyncio.Task[None]) -> None:
    """A relay whose stream to its neighbour failed is of no use: say why and exit (its
    callers then fail the run)."""
    if not task.cancelled() and task.exception() is not None:
        print(f"hop_ceiling relay: {task.exception()!r}", file=sys.stderr, flush=True)
        os._exit(1)


# -- the processes -----------------------------------------------------------------------


@dataclass
class _Process:
    name: str
    proc: subprocess.Popen[bytes]
    address: str

    def cpu_s(self) -> float:
        return process_cpu_s(self.proc.pid)


@contextlib.contextmanager
def _processes(
    case: str,
    max_pull_batches: int,
    queues: int,
    fill: tuple[int, int] = (0, 0),
    dispatch_in_storage: bool = False,
    event_loop: str = EVENT_LOOPS[0],
    storage_writes: bool = False,
) -> Iterator[list[_Process]]:
    """The case's servers, the last one the one clients call, each on ``event_loop``;
    stopped on the way out. With ``dispatch_in_storage`` there is no dispatch relay: the
    gateway watches the storage's appends on the storage itself (one hop fewer). With
    ``storage_writes`` the storage relay writes its appends to segment files in a
    temporary directory, removed on the way out."""
    me = ["bench.hop_ceiling", "serve", "--event-loop", event_loop]
    started: list[_Process] = []

    def start(name: str, module: list[str]) -> _Process:
        address, proc = stack.enter_context(server_process(module, f"the {name} relay"))
        started.append(_Process(name, proc, address))
        return started[-1]

    with contextlib.ExitStack() as stack:
        if case == "echo":
            start("echo", ["tide.bench._echo", "--event-loop", event_loop])
        else:
            store: list[str] = []
            if storage_writes:
                store_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="relay-"))
                store = ["--store-dir", store_dir]
            storage = start("storage", [*me, "storage", *store])
            watched = storage
            if not dispatch_in_storage:
                watched = start("dispatch", [*me, "dispatch", "--storage", storage.address])
            gateway = [*me, "gateway", "--storage", storage.address]
            gateway += ["--dispatch", watched.address]
            gateway += ["--max-pull-batches", str(max_pull_batches), "--queues", str(queues)]
            gateway += ["--pull-min-batches", str(fill[0]), "--pull-min-wait-ms", str(fill[1])]
            start("gateway", gateway)
        yield started


# -- the client --------------------------------------------------------------------------


@dataclass
class _Counts:
    published_batches: int = 0
    consumed_batches: int = 0
    call_latencies_s: list[float] = field(default_factory=list)
    e2e_latencies_s: list[float] = field(default_factory=list)
    measuring: bool = False
    window_monotonic_s: tuple[float, float] = (0.0, 0.0)
    window_cpu_s: float = 0.0  # the client's, in the window


@dataclass(frozen=True)
class _Request:
    """The prebuilt request; ``stamp_at``: where its send time goes (None: not stamped)."""

    data: bytes
    stamp_at: int | None

    def stamped(self) -> bytes:
        at = self.stamp_at
        if at is None:
            return self.data
        stamp = STAMP.pack(time.perf_counter_ns())
        return self.data[:at] + stamp + self.data[at + STAMP.size :]

    def e2e_s(self, data: bytes, now_ns: int) -> list[float]:
        """The latency of each request in ``data`` (pulled: whole requests, one after
        the other, each as sent)."""
        at, size = self.stamp_at, len(self.data)
        if at is None:
            return []
        return [
            (now_ns - STAMP.unpack_from(data, start + at)[0]) / 1e9
            for start in range(0, len(data) - size + 1, size)
        ]


async def _produce(
    channel: grpc.aio.Channel,
    method: str,
    request: _Request,
    inflight: int,
    interval_s: float,
    counts: _Counts,
) -> None:
    """Requests written on one stream, ``inflight`` unanswered at most, one every
    ``interval_s`` on a fixed schedule (0: as fast as answers allow), until cancelled."""
    call = channel.stream_stream(method, None, None)()  # type: ignore[call-arg]
    sent: deque[float] = deque()
    slots = asyncio.Semaphore(inflight)

    async def write() -> None:
        due = time.perf_counter()
        while True:
            await slots.acquire()
            if interval_s:
                due += interval_s
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            sent.append(time.perf_counter())
            await call.write(request.stamped())

    writer = asyncio.create_task(write())
    try:
        while True:
            answer = await call.read()
            if answer is grpc.aio.EOF:  # type: ignore[attr-defined]
                raise RuntimeError("the produce stream ended")
            started = sent.popleft()
            slots.release()
            if counts.measuring:
                counts.published_batches += 1
                counts.call_latencies_s.append(time.perf_counter() - started)
    finally:
        writer.cancel()
        call.cancel()


async def _consume(
    channel: grpc.aio.Channel,
    queue: int,
    batches: tuple[int, int],
    request: _Request,
    counts: _Counts,
    positioned: asyncio.Future[None],
) -> None:
    """Long-poll one queue of the gateway's chunks, asking for ``batches[0]`` batches a
    pull, twice as many after a full answer up to ``batches[1]`` (as ``tide bench``'s
    consumer does with ``pull_batch_max``), from the queue's end when it started
    (``positioned`` is set once that is known)."""
    pull = channel.unary_unary(f"/{RELAY}/Pull", None, None)
    newest: bytes = await pull(SEQUENCE.pack(NEWEST) + PULL_TAIL.pack(queue, 0))
    sequence = SEQUENCE.unpack_from(newest)[0]
    positioned.set_result(None)
    header = SEQUENCE.size + COUNT.size
    base, most = batches
    asked = base
    while True:
        answer: bytes = await pull(SEQUENCE.pack(sequence) + PULL_TAIL.pack(queue, asked))
        now_ns = time.perf_counter_ns()
        sequence = SEQUENCE.unpack_from(answer)[0]
        got = COUNT.unpack_from(answer, SEQUENCE.size)[0]
        asked = min(2 * asked, most) if got >= asked else base
        if counts.measuring:
            counts.consumed_batches += got
            counts.e2e_latencies_s += request.e2e_s(answer[header:], now_ns)


def produce_request(message_size: int, batch: int) -> bytes:
    """A one-topic ProduceRequest of ``batch`` bodies asking for compact results (what
    ``tide bench`` sends)."""
    return _request_bytes(b"x" * message_size, batch)


def _request_bytes(first_body: bytes, batch: int) -> bytes:
    body = first_body[:1] * len(first_body)
    messages = [pb.ProduceMessage(topic="bench-topic", body=first_body)]
    messages += [pb.ProduceMessage(topic="bench-topic", body=body)] * (batch - 1)
    return pb.ProduceRequest(messages=messages, compact_results=True).SerializeToString()


def stamped_request(message_size: int, batch: int) -> _Request:
    """``produce_request``'s request, its first body starting with a slot for its send
    time (None when bodies are shorter than a stamp)."""
    if message_size < STAMP.size:
        return _Request(produce_request(message_size, batch), None)
    data = _request_bytes(STAMP_MARK + b"x" * (message_size - STAMP.size), batch)
    return _Request(data, data.index(STAMP_MARK))


async def _drive(case: str, address: str, args: argparse.Namespace) -> tuple[_Counts, float]:
    counts = _Counts()
    # the chain's consumer reads each request's send time; the others send it unstamped
    stamped = case == "chain-consume"
    request = (
        stamped_request(args.message_size, args.batch)
        if stamped
        else _Request(produce_request(args.message_size, args.batch), None)
    )
    method = "/tide.v1.Gateway/ProduceStream" if case == "echo" else f"/{RELAY}/ProduceStream"
    # requests a second per producer for the whole --rate (messages a second), or unpaced
    interval_s = args.producers * args.batch / args.rate if args.rate else 0.0
    async with contextlib.AsyncExitStack() as stack:
        tasks: list[asyncio.Task[None]] = []
        if case == "chain-consume":
            channel = await stack.enter_async_context(
                grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            )
            batches = _pull_batches(args)
            loop = asyncio.get_running_loop()
            positioned = [loop.create_future() for _ in range(args.queues)]
            for queue, ready in enumerate(positioned):
                tasks.append(
                    asyncio.create_task(_consume(channel, queue, batches, request, counts, ready))
                )
            # the consumers know where the queues end before anything is produced
            await asyncio.wait_for(asyncio.gather(*positioned), POSITION_TIMEOUT_S)
        for _ in range(args.producers):
            channel = await stack.enter_async_context(
                grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            )
            tasks.append(
                asyncio.create_task(
                    _produce(channel, method, request, args.inflight, interval_s, counts)
                )
            )
        await asyncio.sleep(args.warmup_s)
        counts.measuring = True
        started, cpu_started = time.monotonic(), time.process_time()
        await asyncio.sleep(args.duration_s)
        counts.measuring = False
        ended = time.monotonic()
        counts.window_cpu_s = time.process_time() - cpu_started
        counts.window_monotonic_s = (started, ended)
        seconds = ended - started
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return counts, seconds


def _pull_batches(args: argparse.Namespace) -> tuple[int, int]:
    """Whole batches a pull asks for: (at first, at most)."""
    base = math.ceil(args.pull_batch / args.batch)
    return base, max(base, math.ceil(args.pull_batch_max / args.batch))


def relays(
    case: str, args: argparse.Namespace
) -> contextlib.AbstractContextManager[list[_Process]]:
    """The case's relays for the client ``args`` describe (the pull sizes and queues it
    uses), the last the one the client calls; stopped on the way out."""
    fill = (math.ceil(args.pull_min / args.batch), args.pull_min_wait_ms)
    return _processes(
        case,
        _pull_batches(args)[1],
        args.queues,
        fill,
        args.dispatch_in_storage,
        args.event_loop,
        args.storage_writes,
    )


def run_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    if args.address:
        # relays already up: the client alone (their CPU is the caller's to take)
        client_before = time.process_time()
        counts, seconds = asyncio.run(_drive(case, args.address, args))
        return _result(case, args, counts, seconds, {"client": time.process_time() - client_before})
    with relays(case, args) as processes:
        front = processes[-1]
        before = {p.name: p.cpu_s() for p in processes}
        client_before = time.process_time()
        counts, seconds = asyncio.run(_drive(case, front.address, args))
        client_cpu = time.process_time() - client_before
        cpu = {p.name: p.cpu_s() - before[p.name] for p in processes}
    cpu["client"] = client_cpu
    return _result(case, args, counts, seconds, cpu)


def _result(
    case: str, args: argparse.Namespace, counts: _Counts, seconds: float, cpu: dict[str, float]
) -> dict[str, Any]:
    published = counts.published_batches * args.batch
    latencies = sorted(counts.call_latencies_s)
    e2e = sorted(counts.e2e_latencies_s)
    return {
        "case": case,
        "measured_s": round(seconds, 3),
        "publish_msgs_per_s": round(published / seconds),
        "consume_msgs_per_s": round(counts.consumed_batches * args.batch / seconds),
        "call_p50_ms": _percentile_ms(latencies, 0.50),
        "call_p99_ms": _percentile_ms(latencies, 0.99),
        # chain-consume: send -> pulled, per request (None for the other cases)
        "e2e_p50_ms": _percentile_ms(e2e, 0.50),
        "e2e_p99_ms": _percentile_ms(e2e, 0.99),
        # CPU over warm-up + window + stop (a share of what was spent per message).
        "cpu_s": {name: round(value, 2) for name, value in cpu.items()},
        "cpu_us_per_msg": round(1e6 * sum(cpu.values()) / max(1, published), 2),
        # the window exactly: when (the system's monotonic clock), what it published, and
        # the client's CPU in it
        "window_monotonic_s": [round(value, 4) for value in counts.window_monotonic_s],
        "published": published,
        "client_window_cpu_s": round(counts.window_cpu_s, 4),
    }


def _percentile_ms(sorted_s: list[float], q: float) -> float | None:
    if not sorted_s:
        return None
    return round(1000 * sorted_s[min(len(sorted_s) - 1, int(q * len(sorted_s)))], 3)


def _table(results: list[dict[str, Any]]) -> str:
    echo = next((r["publish_msgs_per_s"] for r in results if r["case"] == "echo"), None)
    lines = [
        "| case | publish msgs/s | consume msgs/s | ratio to echo | call p50 / p99 ms "
        "| e2e p50 / p99 ms | CPU s (client, servers) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ratio = f"{r['publish_msgs_per_s'] / echo:.2f}" if echo else "-"
        cpu = ", ".join(f"{name} {value}" for name, value in r["cpu_s"].items())
        lines.append(
            f"| {r['case']} | {r['publish_msgs_per_s']:,} | {r['consume_msgs_per_s']:,} "
            f"| {ratio} | {r['call_p50_ms']} / {r['call_p99_ms']} "
            f"| {r['e2e_p50_ms']} / {r['e2e_p99_ms']} | {cpu} |"
        )
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("serve", help="run one relay (used by the benchmark itself)")
    serve.add_argument("role", choices=["storage", "dispatch", "gateway"])
    serve.add_argument("ready_file", type=Path)
    serve.add_argument("--storage", default="")
    serve.add_argument("--dispatch", default="")
    serve.add_argument("--max-pull-batches", type=int, default=3)
    serve.add_argument("--queues", type=int, default=4)
    serve.add_argument("--pull-min-batches", type=int, default=0)
    serve.add_argument("--pull-min-wait-ms", type=int, default=0)
    serve.add_argument("--event-loop", choices=EVENT_LOOPS, default=EVENT_LOOPS[0])
    serve.add_argument("--store-dir", type=Path, help="the storage: write appends here")
    parser.add_argument("--cases", default=",".join(CASES), help=f"of {', '.join(CASES)}")
    parser.add_argument("--message-size", type=int, default=128, help="body bytes")
    parser.add_argument("--batch", type=int, default=100, help="messages per request")
    parser.add_argument("--producers", type=int, default=1, help="each on its own channel")
    parser.add_argument("--inflight", type=int, default=16, help="requests per producer")
    parser.add_argument("--rate", type=float, default=0, help="msgs/s in all; 0: unpaced")
    parser.add_argument("--pull-batch", type=int, default=256, help="messages per Pull")
    parser.add_argument(
        "--pull-batch-max",
        type=int,
        default=0,
        help="after a full pull the next asks twice as many, up to this; 0: --pull-batch",
    )
    parser.add_argument("--queues", type=int, default=4, help="pulled concurrently")
    parser.add_argument(
        "--pull-min",
        type=int,
        default=0,
        help="a pull waits for this many messages (whole batches; Tide's min_messages)",
    )
    parser.add_argument(
        "--pull-min-wait-ms", type=int, default=0, help="for at most this long (0: no wait)"
    )
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=1, help="the cases again, in turn")
    parser.add_argument("--json-out", type=Path, help="write the results here")
    parser.add_argument(
        "--dispatch-in-storage",
        action="store_true",
        help="no dispatch relay: the gateway watches the storage's appends on the storage",
    )
    parser.add_argument(
        "--storage-writes",
        action="store_true",
        help="the storage relay also writes its appends to memory-mapped segment files, "
        "an fdatasync every 500 ms (what storing costs at the least, as --flush async)",
    )
    parser.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=EVENT_LOOPS[0],
        help="the relays' (and the echo's) event loop; the default is the one Tide's "
        "services run on by default (their --event-loop), so the ceiling is the same "
        "runtime's; the client runs on asyncio's, as tide bench's load generator",
    )
    parser.add_argument(
        "--address",
        default="",
        help="HOST:PORT of relays already up (one case: theirs); only the client runs",
    )
    return parser


def check_limits(args: argparse.Namespace, limits: dict[str, tuple[float, float]]) -> None:
    """Exit naming the first option outside its (lowest, highest) bounds."""
    for name, (lowest, highest) in limits.items():
        value = getattr(args, name)
        if not lowest <= value <= highest:
            flag = "--" + name.replace("_", "-")
            raise SystemExit(f"{flag} is {value:g}; give {lowest:g}..{highest:g}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options (the relays' and the client's shape)."""
    return _parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.command == "serve":
        run_on(args.event_loop, _serve(args.role, args.ready_file, args))
        return 0
    check_limits(args, LIMITS)
    cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})")
    if args.address and len(cases) != 1:
        raise SystemExit(f"--address runs one case (the relays' there), not {len(cases)}")
    results = [run_case(case, args) for _ in range(args.rounds) for case in cases]
    print(_table(results))
    if args.json_out:
        shape = {k: v for k, v in vars(args).items() if k not in ("json_out", "command")}
        document = {"shape": shape, "results": results, "loadavg": os.getloadavg()}
        args.json_out.write_text(json.dumps(document, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
