"""Many long-polling pulls held at once by one gateway: all answered (by an arrival or by
their timeout), with bounded memory and no thread per held call; the limit refuses more."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import grpc

from tests._cluster import Cluster, GatewayProcess, cluster_fixture
from tests.services.gateway.conftest import RPC_TIMEOUT_S, expect_error
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.waiting import wait_until_async

held_cluster = cluster_fixture(name="held_cluster", brokers=1)

HELD_PULLS = 10_000
CLIENT_CHANNELS = 8
POLL_TIMEOUT_MS = 15_000
WAVE = 1_000
# Generous: the 5,000 woken pulls share one read and answer within a second or so.
WOKEN_WITHIN_S = 10.0
WAVE_PAUSE_S = 0.1
# Generous: a gateway holding 10,000 calls needs far less (measured around 100 MB more).
MAX_RSS_GROWTH_BYTES = 600 * 1024 * 1024
Status = pb.PullResponse.Status


def proc_status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def rss_bytes(pid: int) -> int:
    return int(proc_status(pid)["VmRSS"].split()[0]) * 1024


def threads(pid: int) -> int:
    return int(proc_status(pid)["Threads"])


async def hold_many(
    gateway: GatewayProcess, topic: str
) -> tuple[list[tuple[int, pb.PullResponse | grpc.StatusCode, float]], float, int, int]:
    """HELD_PULLS pulls on queues 0 and 1; queue 0 gets a message once they are held.
    Returns (queue, answer, seconds since the start) for each, when the message was
    sent, and the highest thread count and RSS seen."""
    target, pid, wake = gateway.listen, gateway.proc.pid, gateway.stub
    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.channel_id", index)])
        for index in range(CLIENT_CHANNELS)
    ]
    stubs = [pb_grpc.GatewayStub(channel) for channel in channels]
    failures: Counter[str] = Counter()
    started = time.monotonic()

    async def one(index: int) -> tuple[int, pb.PullResponse | grpc.StatusCode, float]:
        queue_id = index % 2
        request = pb.PullRequest(
            consumer_group="G_held",
            topic=topic,
            broker_name="broker-a",
            queue_id=queue_id,
            offset=0,
            long_poll_timeout_ms=POLL_TIMEOUT_MS,
        )
        try:
            answer = await stubs[index % CLIENT_CHANNELS].Pull(request, timeout=120)
        except grpc.aio.AioRpcError as exc:
            failures[f"{exc.code().name}: {exc.details()}"[:300]] += 1
            return queue_id, exc.code(), time.monotonic() - started
        return queue_id, answer, time.monotonic() - started

    try:
        calls: list[asyncio.Future[tuple[int, pb.PullResponse | grpc.StatusCode, float]]] = []
        most_threads = most_rss = 0
        # In waves of 1,000 (the server takes up to 20,000 pending calls; tide.server).
        for start in range(0, HELD_PULLS, WAVE):
            calls.extend(asyncio.ensure_future(one(i)) for i in range(start, start + WAVE))
            # Deliberately lets time pass: paces the waves (the calls go out meanwhile).
            await asyncio.sleep(WAVE_PAUSE_S)
            most_threads = max(most_threads, threads(pid))
            most_rss = max(most_rss, rss_bytes(pid))

        async def all_held() -> bool:
            return await asyncio.to_thread(gateway.held_pulls) >= HELD_PULLS

        await wait_until_async(
            all_held,
            f"{HELD_PULLS} held pulls",
            POLL_TIMEOUT_MS / 1000,
            interval_s=0.2,
            state=lambda: f"{sum(call.done() for call in calls)} answered already",
        )
        early = Counter(str(call.result()[1])[:200] for call in calls if call.done())
        assert not early, f"pulls answered before anything was sent: {early}"
        woke_s = time.monotonic() - started
        await asyncio.to_thread(
            wake.Produce,
            pb.ProduceRequest(
                messages=[
                    pb.ProduceMessage(
                        topic=topic, body=b"wake", queue=pb.QueueRef(broker_name="broker-a")
                    )
                ]
            ),
            timeout=RPC_TIMEOUT_S,
        )

        def all_answered() -> bool:
            nonlocal most_threads, most_rss
            most_threads = max(most_threads, threads(pid))
            most_rss = max(most_rss, rss_bytes(pid))
            return all(call.done() for call in calls)

        await wait_until_async(all_answered, "every pull answered", 120, interval_s=0.2)
        assert not failures, f"pulls failed: {failures}"
        return [call.result() for call in calls], woke_s, most_threads, most_rss
    finally:
        for channel in channels:
            await channel.close(None)


def test_ten_thousand_held_pulls_are_all_answered_in_bounded_memory(
    held_cluster: Cluster,
) -> None:
    topic = "T_held_many"
    held_cluster.create_topic(topic, queues=2)
    gateway = held_cluster.gateway
    pid = gateway.proc.pid
    threads_before = threads(pid)
    rss_before = rss_bytes(pid)
    started = time.monotonic()
    results, woke_s, most_threads, most_rss = asyncio.run(hold_many(gateway, topic))
    elapsed_s = time.monotonic() - started
    errors = Counter(answer for _, answer, _ in results if isinstance(answer, grpc.StatusCode))
    assert not errors, f"pulls failed: {errors}; gateway stderr:\n{gateway.stderr()[-3000:]}"
    woken = [(s, a) for q, a, s in results if q == 0]
    timed_out = [(s, a) for q, a, s in results if q == 1]
    assert all(
        isinstance(a, pb.PullResponse)
        and a.status == Status.FOUND
        and a.messages[0].body == b"wake"
        for _, a in woken
    )
    assert all(
        isinstance(a, pb.PullResponse) and a.status == Status.NO_NEW_MESSAGE for _, a in timed_out
    )
    # The woken ones answered long before their timeout, the others not before it.
    last_woken_s = max(s for s, _ in woken) - woke_s
    assert last_woken_s < WOKEN_WITHIN_S, f"the last woken pull answered {last_woken_s:.1f} s late"
    assert min(s for s, _ in timed_out) >= POLL_TIMEOUT_MS / 1000 - 0.5
    # All held at once: held one after another they would take many timeouts.
    assert elapsed_s < 3 * POLL_TIMEOUT_MS / 1000, elapsed_s
    assert most_threads <= threads_before + 2, (threads_before, most_threads)
    growth = most_rss - rss_before
    print(  # shown with pytest -s
        f"held {HELD_PULLS}: RSS {rss_before / 2**20:.0f} -> {most_rss / 2**20:.0f} MiB, "
        f"threads {threads_before} -> {most_threads}, {elapsed_s:.1f} s"
    )
    assert growth < MAX_RSS_GROWTH_BYTES, f"gateway RSS grew by {growth / 2**20:.0f} MiB"
    # Still healthy afterwards, and the held calls are gone.
    after = gateway.stub.Pull(
        pb.PullRequest(topic=topic, broker_name="broker-a", queue_id=0), timeout=RPC_TIMEOUT_S
    )
    assert after.status == Status.FOUND
    assert threads(pid) <= threads_before + 2


def test_pulls_past_the_limit_get_resource_exhausted(held_cluster: Cluster) -> None:
    topic = "T_held_limit"
    held_cluster.create_topic(topic, queues=1)
    gateway = held_cluster.restart_gateway("--max-held-pulls", "3")
    stub = gateway.stub
    request = pb.PullRequest(
        topic=topic, broker_name="broker-a", queue_id=0, long_poll_timeout_ms=20_000
    )
    held = [stub.Pull.future(request, timeout=RPC_TIMEOUT_S + 20) for _ in range(3)]
    gateway.wait_held(3)
    assert not any(call.done() for call in held)
    expect_error(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        lambda: stub.Pull(request, timeout=RPC_TIMEOUT_S),
        "--max-held-pulls 3",
    )
    quick = pb.PullRequest(topic=topic, broker_name="broker-a", queue_id=0)
    assert stub.Pull(quick, timeout=RPC_TIMEOUT_S).status == Status.NO_NEW_MESSAGE  # not held
    stub.Produce(
        pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic, body=b"x")]),
        timeout=RPC_TIMEOUT_S,
    )
    assert all(call.result().status == Status.FOUND for call in held)


def test_stopping_gateway_answers_held_pulls_at_once(held_cluster: Cluster) -> None:
    topic = "T_held_stop"
    held_cluster.create_topic(topic, queues=1)
    gateway = held_cluster.restart_gateway()
    request = pb.PullRequest(
        topic=topic, broker_name="broker-a", queue_id=0, long_poll_timeout_ms=30_000
    )
    held = [gateway.stub.Pull.future(request, timeout=60) for _ in range(5)]
    gateway.wait_held(5)
    assert not any(call.done() for call in held)
    stopping = time.monotonic()
    gateway.proc.terminate()
    answers = [call.result() for call in held]
    assert all(answer.status == Status.NO_NEW_MESSAGE for answer in answers)
    assert gateway.wait_exit() == 0, gateway.describe()
    assert time.monotonic() - stopping < 15, "held pulls waited for their timeout"
    held_cluster.restart_gateway()  # for whatever runs next
