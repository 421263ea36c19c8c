"""The cost of authentication (signature + ACL decision) as a ratio of the
unauthenticated path, in the same run (acl, issue 22).

    python -m bench.auth_signature                          # 6 rounds of 5 s per phase
    python -m bench.auth_signature --duration-s 2 --rounds 2   # a smoke run

Starts real processes on a fresh store: a name server, one broker (storage + dispatch)
and TWO gateways in front of it: ``plain`` (no authentication) and ``auth``
(``--auth-enabled``). A normal user granted ``Pub`` on the topic (a prefixed entry and a
deny entry on another topic, so the ACL decision has entries to walk) produces through
``auth``, each call signed afresh (HMAC-SHA1 of its x-mq-date-time) on the client side,
the unsigned client through ``plain``; the same raw stubs, Produce of ``--batch``
(100) messages of 128 bytes, ``--inflight`` calls in flight. Phases alternate AB, BA, ...
over ``--rounds``. Signatures alone: no TLS (the transport's share is the tls part's).
Reports messages/s per phase (median), auth / plain of each round (its two phases back
to back) and their median; also ``bench/results/auth_signature.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import grpc

from bench.gateway_produce_pull import free_port, loadavg
from tide.auth.signature import signed_metadata
from tide.spawn import running
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1 import storage_pb2 as storage_pb

BROKER = "broker-a"
TOPIC = "BenchAuth"
BODY = b"x" * 128
ADMIN = ("admin", "bench-admin-secret-0123456789")
USER = ("bench", "bench-user-secret-0123456789")
PHASES = ("plain", "auth")
RESULTS = Path(__file__).parent / "results" / "auth_signature.json"
CALL_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 60.0
REFRESH_MS = 200


@contextmanager
def _service(label: str, module: str, args: list[str], run_dir: Path) -> Iterator[str]:
    cmd = [sys.executable, "-m", f"services.{module}", *args, "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    with running(
        cmd,
        run_dir / f"{label}.ready",
        label,
        READY_TIMEOUT_S,
        stderr_path=run_dir / f"{label}.log",
        env=env,
        stop_timeout_s=READY_TIMEOUT_S,
    ) as process:
        yield process.listen


def _cluster(stack: ExitStack, root: Path) -> tuple[str, str]:
    namesrv = stack.enter_context(
        _service("nameserver", "nameserver", ["--listen", "127.0.0.1:0"], root)
    )
    storage_port, dispatch_port = free_port(), free_port()
    store = root / "store"
    admin_file = root / "admin.json"
    admin_file.write_text(json.dumps({"username": ADMIN[0], "password": ADMIN[1]}))
    storage = [
        *("--listen", f"127.0.0.1:{storage_port}", "--store-dir", str(store)),
        *("--namesrv", namesrv, "--broker-name", BROKER),
        *("--dispatch-address", f"127.0.0.1:{dispatch_port}"),
        *("--auth-init-user-file", str(admin_file)),
    ]
    stack.enter_context(_service("storage", "storage", storage, root))
    dispatch = [
        *("--listen", f"127.0.0.1:{dispatch_port}", "--store-dir", str(store)),
        *("--storage", f"127.0.0.1:{storage_port}"),
    ]
    stack.enter_context(_service("dispatch", "dispatch", dispatch, root))
    gateway = ["--listen", "127.0.0.1:0", "--namesrv", namesrv]
    plain = stack.enter_context(_service("gateway-plain", "gateway", gateway, root))
    auth_args = [*gateway, "--auth-enabled", "--auth-refresh-interval-ms", str(REFRESH_MS)]
    auth = stack.enter_context(_service("gateway-auth", "gateway", auth_args, root))
    return plain, auth


async def _setup(plain: Any, auth: Any, queues: int) -> None:  # aio stubs
    admin = signed_metadata(*ADMIN)
    await plain.CreateTopic(
        pb.CreateTopicRequest(topic=TOPIC, read_queue_nums=queues, write_queue_nums=queues),
        timeout=CALL_TIMEOUT_S,
    )
    while True:  # until the auth gateway fetched the admin
        try:
            await auth.ListUsers(pb.ListUsersRequest(), metadata=signed_metadata(*ADMIN), timeout=5)
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(REFRESH_MS / 1000)
    user = storage_pb.AuthUser(access_key=USER[0], secret_key=USER[1])
    await auth.CreateUser(pb.UserRequest(user=user), metadata=admin, timeout=CALL_TIMEOUT_S)
    entries = [
        storage_pb.AuthPolicyEntry(resource="Topic:Bench*", actions=["Pub", "Sub"]),
        storage_pb.AuthPolicyEntry(resource="Topic:BenchSecret", actions=["All"], decision="Deny"),
        storage_pb.AuthPolicyEntry(resource="Group:*", actions=["Sub"]),
    ]
    acl = storage_pb.AuthAcl(access_key=USER[0], entries=entries)
    await auth.CreateAcl(pb.AclRequest(acl=acl), metadata=signed_metadata(*ADMIN), timeout=30)


async def _rate(stub: Any, signed: bool, args: argparse.Namespace) -> float:
    request = pb.ProduceRequest(messages=[pb.ProduceMessage(topic=TOPIC, body=BODY)] * args.batch)
    deadline = time.monotonic() + args.duration_s
    done = [0] * args.inflight

    async def worker(index: int) -> None:
        while time.monotonic() < deadline:
            metadata = signed_metadata(*USER) if signed else None  # each call signed afresh
            await stub.Produce(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
            done[index] += args.batch

    started = time.monotonic()
    await asyncio.gather(*(worker(i) for i in range(args.inflight)))
    return sum(done) / (time.monotonic() - started)


async def run(
    plain_address: str, auth_address: str, args: argparse.Namespace
) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {phase: [] for phase in PHASES}
    async with (
        grpc.aio.insecure_channel(plain_address) as plain_channel,
        grpc.aio.insecure_channel(auth_address) as auth_channel,
    ):
        plain, auth = pb_grpc.GatewayStub(plain_channel), pb_grpc.GatewayStub(auth_channel)
        await _setup(plain, auth, args.queues)
        while True:  # until the user's grant is in effect
            try:
                await auth.Produce(
                    pb.ProduceRequest(messages=[pb.ProduceMessage(topic=TOPIC, body=BODY)]),
                    metadata=signed_metadata(*USER),
                    timeout=5,
                )
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(REFRESH_MS / 1000)
        stubs = {"plain": (plain, False), "auth": (auth, True)}
        for phase in PHASES:  # warm up both
            await _rate(*stubs[phase], argparse.Namespace(**{**vars(args), "duration_s": 1.0}))
        for round_index in range(args.rounds):
            order = PHASES if round_index % 2 == 0 else tuple(reversed(PHASES))
            for phase in order:
                rate = await _rate(*stubs[phase], args)
                rates[phase].append(rate)
                print(f"round {round_index + 1} {phase}: {rate:,.0f} msg/s", flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=6, choices=range(1, 21))
    parser.add_argument("--queues", type=int, default=4, choices=range(1, 65))
    parser.add_argument("--inflight", type=int, default=4, choices=range(1, 257))
    parser.add_argument("--batch", type=int, default=100, choices=range(1, 1001))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tide-auth-bench-"))
    load_before = loadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    try:
        with ExitStack() as stack:
            rates = asyncio.run(run(*_cluster(stack, root), args))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratios = [a / p for p, a in zip(rates["plain"], rates["auth"], strict=True) if p]
    summary = {
        "args": vars(args),
        "started": started,
        "rates_msg_s": rates,
        "median_msg_s": {phase: statistics.median(v) for phase, v in rates.items()},
        "auth_over_plain_each_round": ratios,
        "auth_over_plain_median": statistics.median(ratios),
        "loadavg": {"before": load_before, "after": loadavg()},
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
