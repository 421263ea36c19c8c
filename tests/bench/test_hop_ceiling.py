"""bench/hop_ceiling.py: the relays carry messages end to end, the chunk buffer's rules,
and the command line (real relay processes, about 10 s)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench import hop_ceiling
from bench.hop_ceiling import COUNT, _Chunks, _FanOut, _joined

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
    # The relays' ready files (tempfile's) under tmp_path: their command lines name it, so
    # the check below sees this run's relays only, not another benchmark on the machine.
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False, env=env
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
    # The consumer got what went through storage -> dispatch -> gateway.
    assert results["chain-consume"]["consume_msgs_per_s"] > 0
    # Every relay was stopped.
    leftovers = subprocess.run(
        ["pgrep", "-f", f"bench[.]hop_ceiling serve .*{re.escape(str(tmp_path))}/"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert leftovers.stdout.strip() == ""


def test_unknown_cases_are_refused() -> None:
    with pytest.raises(SystemExit, match="--cases: unknown nope"):
        hop_ceiling.main(["--cases", "echo,nope"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch", "0"], "--batch is 0; give 1..1024"),
        (["--inflight", "65"], "--inflight is 65; give 1..64"),
        (["--duration-s", "0"], "--duration-s is 0; give 0.1..600"),
    ],
)
def test_out_of_range_options_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        hop_ceiling.main(argv)


def test_a_paced_run_stays_at_its_rate_and_two_queues_are_consumed(tmp_path: Path) -> None:
    out = tmp_path / "paced.json"
    command = [sys.executable, "-m", "bench.hop_ceiling", "--cases", "chain-consume"]
    command += ["--batch", "1", "--rate", "200", "--queues", "2", "--pull-batch", "8"]
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
