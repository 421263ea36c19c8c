"""bench/hop_ceiling.py: the relays carry messages end to end, the chunk buffer's rules,
and the command line (real relay processes, about 10 s)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from bench import hop_ceiling
from bench.hop_ceiling import (
    COUNT,
    PULL_TAIL,
    SEQUENCE,
    STAMP,
    _Chunks,
    _FanOut,
    _Fill,
    _Gateway,
    _joined,
    _SegmentLog,
)
from tide.v1 import gateway_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


def _chunk(batches: int, payload: bytes) -> bytes:
    return COUNT.pack(batches) + payload


def test_chunks_are_numbered_from_one_and_taken_in_whole_chunks() -> None:
    async def scenario() -> None:
        chunks = _Chunks()
        assert chunks.after(0, 3) == (0, 0, [])  # nothing yet: the caller waits
        chunks.add(_chunk(2, b"ab"))
        chunks.add(_chunk(2, b"cd"))
        chunks.add(_chunk(1, b"e"))
        # at most 3 batches, but always one chunk, and never half of one
        assert chunks.after(0, 3) == (2, 4, [b"ab", b"cd"])
        assert chunks.after(0, 1) == (1, 2, [b"ab"])
        assert chunks.after(2, 3) == (3, 1, [b"e"])
        assert chunks.after(3, 3) == (3, 0, [])

    asyncio.run(scenario())


def test_a_consumer_behind_the_dropped_chunks_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hop_ceiling, "MAX_BUFFERED_CHUNK_BYTES", 10)

    async def scenario() -> None:
        chunks = _Chunks()
        chunks.add(_chunk(1, b"12345678"))  # 12 bytes: over the budget, the first is dropped
        chunks.add(_chunk(1, b"x"))
        assert chunks.first_sequence == 2
        with pytest.raises(RuntimeError, match="chunk 1 already dropped"):
            chunks.after(0, 3)
        assert chunks.after(1, 3) == (2, 1, [b"x"])

    asyncio.run(scenario())


def test_a_fuller_pull_waits_for_its_batches_or_its_wait() -> None:
    """``--pull-min`` / ``--pull-min-wait-ms``: the relay gateway holds a pull until that
    many batches are there (as Tide's min_messages), or answers what there is at the end."""

    async def scenario() -> None:
        gateway = _Gateway("", "", 10, 1, _Fill(batches=3, wait_s=30.0))
        chunks = gateway.queues[0]
        chunks.add(_chunk(1, b"a"))
        request = SEQUENCE.pack(0) + PULL_TAIL.pack(0, 10)
        pull = asyncio.create_task(gateway.pull(request, None))  # type: ignore[arg-type]
        for _ in range(5):
            await asyncio.sleep(0)
        assert not pull.done()  # 1 batch of the 3 it waits for
        chunks.add(_chunk(2, b"bc"))
        answer = await asyncio.wait_for(pull, 5.0)
        assert answer == SEQUENCE.pack(2) + COUNT.pack(3) + b"abc"
        gateway.fill = _Fill(batches=3, wait_s=0.05)
        chunks.add(_chunk(1, b"d"))
        again = SEQUENCE.pack(2) + PULL_TAIL.pack(0, 10)
        short = await asyncio.wait_for(gateway.pull(again, None), 5.0)  # type: ignore[arg-type]
        assert short == SEQUENCE.pack(3) + COUNT.pack(1) + b"d"

    asyncio.run(scenario())


def test_joined_appends_add_up_their_batches() -> None:
    async def scenario() -> None:
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        queue.put_nowait(_chunk(3, b"def"))
        queue.put_nowait(_chunk(1, b"g"))
        assert _joined(_chunk(2, b"abc"), queue) == _chunk(6, b"abcdefg")
        assert queue.empty()

    asyncio.run(scenario())


def test_a_follower_too_far_behind_ends_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hop_ceiling, "MAX_QUEUED_BLOBS", 2)

    async def scenario() -> None:
        fan_out = _FanOut(join=False)
        stream = fan_out.stream(b"", None)
        first = asyncio.ensure_future(anext(stream))  # the stream opens its queue
        await asyncio.sleep(0)
        fan_out.push(b"a")
        assert await first == b"a"
        fan_out.push(b"b")
        fan_out.push(b"c")
        with pytest.raises(RuntimeError, match="a follower is 2 messages behind"):
            fan_out.push(b"d")
        await stream.aclose()
        assert fan_out.queues == []  # a closed stream leaves nothing behind

    asyncio.run(scenario())


def test_the_cases_run_end_to_end_and_report(tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    command = [sys.executable, "-m", "bench.hop_ceiling", "--batch", "10", "--inflight", "4"]
    command += ["--warmup-s", "0.3", "--duration-s", "1", "--json-out", str(out)]
    # The relays inherit this mark, so the leftover check below finds this run's relays
    # only, not another test's or benchmark's on the same machine.
    mark = f"TIDE_TEST_RUN={uuid.uuid4().hex}"
    key, value = mark.split("=")
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, key: value},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "| chain-consume |" in done.stdout
    document = json.loads(out.read_text())
    assert document["shape"]["batch"] == 10
    results = {r["case"]: r for r in document["results"]}
    assert list(results) == ["echo", "chain", "chain-consume"]
    for case, result in results.items():
        assert result["publish_msgs_per_s"] > 0, case
        assert result["call_p50_ms"] is not None and result["call_p50_ms"] > 0, case
        assert all(value >= 0 for value in result["cpu_s"].values()), case
    assert set(results["echo"]["cpu_s"]) == {"echo", "client"}
    assert set(results["chain"]["cpu_s"]) == {"storage", "dispatch", "gateway", "client"}
    assert results["chain"]["consume_msgs_per_s"] == 0
    assert results["echo"]["e2e_p99_ms"] is None  # only the consumer measures it
    # The consumer got what went through storage -> dispatch -> gateway.
    assert results["chain-consume"]["consume_msgs_per_s"] > 0
    # Every relay of this run was stopped.
    assert _processes_marked(mark) == []


def _processes_marked(mark: str) -> list[int]:
    """The live processes whose environment holds ``mark``."""
    marked = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state != "Z" and mark.encode() in environ.split(b"\0"):
            marked.append(int(entry.name))
    return marked


def test_unknown_cases_are_refused() -> None:
    with pytest.raises(SystemExit, match="--cases: unknown nope"):
        hop_ceiling.main(["--cases", "echo,nope"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch", "0"], "--batch is 0; give 1..1024"),
        (["--inflight", "65"], "--inflight is 65; give 1..64"),
        (["--duration-s", "0"], "--duration-s is 0; give 0.1..600"),
        (["--pull-batch-max", "2000"], "--pull-batch-max is 2000; give 0..1024"),
        (["--pull-min-wait-ms", "30001"], "--pull-min-wait-ms is 30001; give 0..30000"),
    ],
)
def test_out_of_range_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        hop_ceiling.main(argv)


def test_a_paced_run_stays_at_its_rate_and_two_queues_are_consumed(tmp_path: Path) -> None:
    out = tmp_path / "paced.json"
    command = [sys.executable, "-m", "bench.hop_ceiling", "--cases", "chain-consume"]
    command += ["--batch", "1", "--rate", "200", "--queues", "2", "--pull-batch", "8"]
    command += ["--pull-batch-max", "32"]
    command += ["--warmup-s", "0.3", "--duration-s", "1.5", "--json-out", str(out)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(out.read_text())["results"]
    # A fixed schedule from the start: even if every request due in the warm-up were
    # answered in the window, no more than the rate over warm-up + window (+1 at the edge).
    assert 0 < result["publish_msgs_per_s"] * 1.5 <= 200 * (0.3 + 1.5) + 1
    assert result["consume_msgs_per_s"] > 0
    # each pulled request's send time came back: its end-to-end latency is reported
    assert 0 < result["e2e_p50_ms"] <= result["e2e_p99_ms"]


def test_a_stamped_request_carries_its_send_time_to_the_consumer() -> None:
    request = hop_ceiling.stamped_request(message_size=32, batch=3)
    assert request.stamp_at is not None
    plain = pb.ProduceRequest.FromString(hop_ceiling.produce_request(32, 3))
    sent = [request.stamped() for _ in range(2)]
    for data in sent:
        parsed = pb.ProduceRequest.FromString(data)  # still a valid request of its shape
        assert [len(m.body) for m in parsed.messages] == [len(m.body) for m in plain.messages]
        assert len(data) == len(request.data)
    stamps_ns = [STAMP.unpack_from(data, request.stamp_at)[0] for data in sent]
    now_ns = stamps_ns[-1] + 5_000_000
    # what a pull answers: whole requests, one after the other
    latencies = request.e2e_s(b"".join(sent), now_ns)
    assert latencies == [(now_ns - stamp) / 1e9 for stamp in stamps_ns]
    assert latencies[-1] == 0.005


def test_bodies_too_short_for_a_stamp_go_unstamped() -> None:
    request = hop_ceiling.stamped_request(message_size=4, batch=2)
    assert request.stamp_at is None
    assert request.stamped() == hop_ceiling.produce_request(4, 2)
    assert request.e2e_s(request.data * 3, 0) == []


def test_a_pull_of_the_newest_chunk_positions_a_consumer_at_the_end() -> None:
    """Relays that carried earlier runs: a new consumer asks where a queue ends (sequence
    -1, answered at once with no batches) and reads only what comes after."""

    async def scenario() -> None:
        gateway = _Gateway("", "", 10, 1, _Fill(batches=0, wait_s=0.0))
        chunks = gateway.queues[0]
        newest = SEQUENCE.pack(hop_ceiling.NEWEST) + PULL_TAIL.pack(0, 0)
        assert await gateway.pull(newest, None) == SEQUENCE.pack(0) + COUNT.pack(0)  # type: ignore[arg-type]
        chunks.add(_chunk(1, b"a"))
        chunks.add(_chunk(2, b"bc"))
        answer = await gateway.pull(newest, None)  # type: ignore[arg-type]
        assert answer == SEQUENCE.pack(2) + COUNT.pack(0)
        chunks.add(_chunk(1, b"d"))
        after = SEQUENCE.pack(2) + PULL_TAIL.pack(0, 10)
        assert await gateway.pull(after, None) == SEQUENCE.pack(3) + COUNT.pack(1) + b"d"  # type: ignore[arg-type]

    asyncio.run(scenario())


def test_the_client_alone_runs_against_relays_already_up(tmp_path: Path) -> None:
    """``--address``: two client runs against one set of relays; the second's consumer
    starts at the end, and each result says when its window was."""
    args = hop_ceiling.parse(["--cases", "chain-consume", "--batch", "10", "--inflight", "4"])
    with hop_ceiling.relays("chain-consume", args) as relays:
        front = relays[-1].address
        results = []
        for run in range(2):
            out = tmp_path / f"run{run}.json"
            command = [sys.executable, "-m", "bench.hop_ceiling", "--cases", "chain-consume"]
            command += ["--batch", "10", "--inflight", "4", "--address", front]
            # the second measures from its start: a chunk of the first read would count
            warmup = "0.3" if run == 0 else "0"
            command += ["--warmup-s", warmup, "--duration-s", "1", "--json-out", str(out)]
            done = subprocess.run(
                command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
            )
            assert done.returncode == 0, done.stderr
            (result,) = json.loads(out.read_text())["results"]
            results.append(result)
        assert all(relay.proc.poll() is None for relay in relays)  # still up for the next
    for result in results:
        assert set(result["cpu_s"]) == {"client"}  # the relays' CPU is not the client's
        start, end = result["window_monotonic_s"]
        assert end - start == pytest.approx(result["measured_s"], abs=0.01)
        assert result["published"] > 0 and result["consume_msgs_per_s"] > 0
        assert 0 <= result["client_window_cpu_s"] <= result["cpu_s"]["client"]
    assert results[0]["window_monotonic_s"][1] < results[1]["window_monotonic_s"][0]
    # The second consumer did not read the first run's chunks (still buffered in the
    # relay, about as many as it publishes itself): it measures from its start, so it
    # consumed no more than it published, give or take the requests in flight (a request
    # pulled before its answer came back: 4 of 10 messages in the window of 1 s).
    second = results[1]
    assert second["consume_msgs_per_s"] <= second["publish_msgs_per_s"] + 4 * 10 / 0.9


def test_the_client_alone_runs_one_case() -> None:
    with pytest.raises(SystemExit, match="--address runs one case"):
        hop_ceiling.main(["--cases", "chain,chain-consume", "--address", "127.0.0.1:1"])


def test_without_a_dispatch_relay_the_gateway_watches_the_storage(tmp_path: Path) -> None:
    """``--dispatch-in-storage``: two relays, and the consumer still gets what was
    appended (the gateway's watch on the storage's appends)."""
    out = tmp_path / "merged.json"
    command = [sys.executable, "-m", "bench.hop_ceiling", "--cases", "chain-consume"]
    command += ["--dispatch-in-storage", "--batch", "10", "--inflight", "4"]
    command += ["--warmup-s", "0.3", "--duration-s", "1", "--json-out", str(out)]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert set(result["cpu_s"]) == {"storage", "gateway", "client"}
    assert result["publish_msgs_per_s"] > 0
    assert result["consume_msgs_per_s"] > 0
    assert 0 < result["e2e_p50_ms"] <= result["e2e_p99_ms"]


def _runs_uvloop(pid: int) -> bool:
    """Whether the process has uvloop's compiled loop mapped (it is imported only when a
    loop is made with it: tide.server's event loop choice)."""
    maps = Path(f"/proc/{pid}/maps").read_text()
    return "uvloop/loop." in maps


@pytest.mark.parametrize("event_loop", ["uvloop", "asyncio"])
def test_the_relays_and_the_echo_run_on_the_loop_asked_for(event_loop: str) -> None:
    """``--event-loop``: the ceiling runs on the loop Tide's services run on (uvloop by
    default) or on the one asked for, each relay and the echo alike."""
    args = hop_ceiling.parse(["--cases", "chain,echo", "--event-loop", event_loop])
    for case in ("chain", "echo"):
        with hop_ceiling.relays(case, args) as processes:
            for process in processes:
                assert _runs_uvloop(process.proc.pid) is (event_loop == "uvloop"), process.name
    assert hop_ceiling.parse([]).event_loop == "uvloop"


def test_the_segment_log_writes_appends_back_to_back_and_rolls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--storage-writes``' log: each append's bytes right after the last, a new
    segment (named by its first offset) when one does not fit, an append larger than a
    segment refused; the flush thread syncs the segments written to."""
    synced: list[int] = []
    two_syncs = threading.Event()

    def fdatasync(fd: int) -> None:
        synced.append(fd)
        if len(synced) >= 2:
            two_syncs.set()

    monkeypatch.setattr(hop_ceiling, "SEGMENT_BYTES", 10)
    monkeypatch.setattr(hop_ceiling, "FLUSH_INTERVAL_S", 0.01)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    log = _SegmentLog(tmp_path)
    for blob in (b"abcd", b"efg", b"hijk", b"lmnopqrstu"):
        log.write(blob)
    with pytest.raises(ValueError, match="an append of 11 bytes does not fit a segment"):
        log.write(b"x" * 11)
    files = sorted(tmp_path.iterdir())
    assert [f.name for f in files] == [f"{offset:020d}" for offset in (0, 10, 20)]
    assert [f.read_bytes() for f in files] == [
        b"abcdefg\0\0\0",
        b"hijk" + b"\0" * 6,
        b"lmnopqrstu",
    ]
    assert two_syncs.wait(10), synced  # the flush thread runs on its own
    log.close()


def test_a_storage_relay_that_stores_writes_what_it_relays(tmp_path: Path) -> None:
    """``--storage-writes``: the chain still carries end to end, the storage relay's
    segment file holds pages of what it appended, and its directory goes with it."""
    args = hop_ceiling.parse(
        ["--cases", "chain-consume", "--batch", "10", "--inflight", "4", "--storage-writes"]
    )
    with hop_ceiling.relays("chain-consume", args) as relays:
        storage = next(relay for relay in relays if relay.name == "storage")
        argv = Path(f"/proc/{storage.proc.pid}/cmdline").read_bytes().split(b"\0")
        store = Path(argv[argv.index(b"--store-dir") + 1].decode())
        out = tmp_path / "run.json"
        command = [sys.executable, "-m", "bench.hop_ceiling", "--cases", "chain-consume"]
        command += ["--batch", "10", "--inflight", "4", "--address", relays[-1].address]
        command += ["--warmup-s", "0.3", "--duration-s", "1", "--json-out", str(out)]
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr
        (result,) = json.loads(out.read_text())["results"]
        assert result["published"] > 0 and result["consume_msgs_per_s"] > 0
        (segment,) = store.iterdir()
        assert segment.name == f"{0:020d}"
        # 10 bodies of 128 bytes an append: at least that many bytes a message stored
        assert segment.stat().st_blocks * 512 >= result["published"] * 128
    assert not store.exists()
