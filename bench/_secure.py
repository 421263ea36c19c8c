"""What the security benchmarks share (bench/tls_cost.py, bench/auth_signature.py): a
one-broker cluster of real processes with TLS and/or authentication, the users set up,
Produce rates measured over alternating phases, and the summary written.

A cluster is a name server, one broker (storage + dispatch) and one or more gateways in
front of it, each gateway with or without ``--auth-enabled``. With ``secure`` every
service also runs the cluster secret; with ``tls`` every port serves TLS (mutual TLS on
the internal links) and the clients verify the gateway against the CA.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from bench.gateway_produce_pull import (
    PROCESSES,
    free_port,
    loadavg,
    own_cpu_s,
    process_cpu_s,
    service,
)
from tide.auth.signature import signed_metadata
from tide.tls import TlsFiles, channel_credentials
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1 import storage_pb2 as storage_pb

BROKER = "broker-a"
BODY = b"x" * 128
ADMIN = ("admin", "bench-admin-secret-0123456789")
USER = ("bench", "bench-user-secret-0123456789")
CLUSTER_SECRET = "bench-cluster-secret-0123456789"
CALL_TIMEOUT_S = 30.0
# Set-up polls this often until a gateway sees the users; the gateways refresh users and
# ACLs at their default interval (2 s), as in production: a shorter one is a cost of its
# own (a GetAuth and a state rebuild each time), not the per-call cost measured here.
REFRESH_MS = 200
SETUP_ATTEMPTS = 300  # x REFRESH_MS: a minute for a gateway to see the users and grants


@dataclass(frozen=True)
class Gateway:
    """A gateway of a bench cluster: its address, whether it authenticates, the TLS."""

    address: str
    auth: bool
    tls: TlsFiles | None
    # The processes that work for this gateway's calls (it, its storage and dispatch):
    # their CPU time per message is measured with the rate.
    pids: tuple[int, ...] = ()

    def channel(self) -> grpc.aio.Channel:
        if self.tls is None:
            return grpc.aio.insecure_channel(self.address)
        credentials = channel_credentials(TlsFiles(ca_file=self.tls.ca_file))
        return grpc.aio.secure_channel(self.address, credentials)


def tls_args(files: TlsFiles | None) -> list[str]:
    if files is None:
        return []
    assert files.cert_file and files.key_file and files.ca_file
    return [
        *("--tls-cert-file", files.cert_file, "--tls-key-file", files.key_file),
        *("--tls-ca-file", files.ca_file),
    ]


def start_cluster(
    stack: ExitStack,
    root: Path,
    *,
    tls: TlsFiles | None,
    secure: bool,
    gateways: dict[str, bool],
) -> dict[str, Gateway]:
    """Start the processes under ``root`` (stopped by ``stack``); ``gateways`` maps a
    name to whether that gateway has ``--auth-enabled``."""
    root.mkdir(parents=True)
    extra = tls_args(tls)
    if secure:
        secret = root / "cluster.secret"
        secret.write_text(CLUSTER_SECRET)
        extra += ["--cluster-secret-file", str(secret)]
    namesrv = stack.enter_context(service("nameserver", ["--listen", "127.0.0.1:0", *extra], root))
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
    stack.enter_context(service("storage", [*storage, *extra], root))
    broker_pids = [PROCESSES["storage"].pid]
    dispatch = [
        *("--listen", f"127.0.0.1:{dispatch_port}", "--store-dir", str(store)),
        *("--storage", f"127.0.0.1:{storage_port}"),
    ]
    stack.enter_context(service("dispatch", [*dispatch, *extra], root))
    broker_pids.append(PROCESSES["dispatch"].pid)
    started = {}
    for name, auth in gateways.items():
        args = ["--listen", "127.0.0.1:0", "--namesrv", namesrv, *extra]
        if auth:
            args += ["--auth-enabled"]
        run_dir = root / name
        run_dir.mkdir()
        address = stack.enter_context(service("gateway", args, run_dir))
        pids = (PROCESSES["gateway"].pid, *broker_pids)
        started[name] = Gateway(address, auth, tls, pids)
    return started


def admin_metadata(gateway: Gateway) -> tuple[tuple[str, str], ...] | None:
    return signed_metadata(*ADMIN) if gateway.auth else None


def user_metadata(gateway: Gateway) -> tuple[tuple[str, str], ...] | None:
    """Each call signed afresh (HMAC-SHA1 of its x-mq-date-time), as a client does."""
    return signed_metadata(*USER) if gateway.auth else None


async def _retry(call: Callable[[], Awaitable[Any]]) -> None:
    """Until ``call`` succeeds (a gateway fetches users and grants every REFRESH_MS)."""
    for _ in range(SETUP_ATTEMPTS):
        try:
            await call()
            return
        except grpc.aio.AioRpcError:
            await asyncio.sleep(REFRESH_MS / 1000)
    await call()  # the last error, raised


async def set_up(stub: Any, gateway: Gateway, topic: str, queues: int) -> None:
    """The topic, and on an authenticating gateway the user with ``Pub`` on it (and a
    prefixed grant and a deny entry, so the ACL decision has entries to walk)."""
    admin = admin_metadata(gateway)
    request = pb.CreateTopicRequest(topic=topic, read_queue_nums=queues, write_queue_nums=queues)
    await _retry(lambda: stub.CreateTopic(request, metadata=admin, timeout=CALL_TIMEOUT_S))
    if gateway.auth:
        await _retry(lambda: stub.ListUsers(pb.ListUsersRequest(), metadata=admin, timeout=5))
        user = storage_pb.AuthUser(access_key=USER[0], secret_key=USER[1])
        try:
            await stub.CreateUser(pb.UserRequest(user=user), metadata=admin, timeout=30)
        except grpc.aio.AioRpcError as exc:  # a second gateway on the same broker
            if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                raise
        entry = storage_pb.AuthPolicyEntry
        entries = [
            entry(resource=f"Topic:{topic[:4]}*", actions=["Pub", "Sub"]),
            entry(resource=f"Topic:{topic}Secret", actions=["All"], decision="Deny"),
            entry(resource="Group:*", actions=["Sub"]),
        ]
        acl = storage_pb.AuthAcl(access_key=USER[0], entries=entries)
        await stub.UpdateAcl(pb.AclRequest(acl=acl), metadata=admin, timeout=30)
    one = pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic, body=BODY)])
    await _retry(lambda: stub.Produce(one, metadata=user_metadata(gateway), timeout=5))


def _cpu_s(gateway: Gateway) -> float:
    """CPU seconds so far of the gateway's processes and of this client process."""
    return sum(process_cpu_s(pid) for pid in gateway.pids) + own_cpu_s()


async def produce_rate(
    stub: Any, gateway: Gateway, topic: str, *, batch: int, inflight: int, duration_s: float
) -> tuple[float, float]:
    """(messages/s, CPU microseconds per message) with ``inflight`` Produce calls of
    ``batch`` x 128 B at once. The CPU is the client's, the gateway's, its storage's and
    dispatch's: on a box shared with other work it says what a message costs even when
    the rate says mostly how much CPU was left."""
    request = pb.ProduceRequest(messages=[pb.ProduceMessage(topic=topic, body=BODY)] * batch)
    deadline = time.monotonic() + duration_s
    done = [0] * inflight

    async def worker(index: int) -> None:
        while time.monotonic() < deadline:
            metadata = user_metadata(gateway)
            await stub.Produce(request, metadata=metadata, timeout=CALL_TIMEOUT_S)
            done[index] += batch

    started, cpu_before = time.monotonic(), _cpu_s(gateway)
    await asyncio.gather(*(worker(i) for i in range(inflight)))
    messages = sum(done)
    cpu_us = (_cpu_s(gateway) - cpu_before) * 1e6
    return messages / (time.monotonic() - started), cpu_us / max(1, messages)


async def alternate(
    gateways: dict[str, Gateway], topic: str, args: argparse.Namespace
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Rates and CPU microseconds per message of every phase (gateway) per round, the
    phases' order reversed every other round (drift of the shared box falls on all
    alike), after a warm-up of each."""
    phases = list(gateways)
    rates: dict[str, list[float]] = {phase: [] for phase in phases}
    cpu: dict[str, list[float]] = {phase: [] for phase in phases}
    channels = {phase: gateway.channel() for phase, gateway in gateways.items()}
    stubs = {phase: pb_grpc.GatewayStub(channel) for phase, channel in channels.items()}
    load = {"batch": args.batch, "inflight": args.inflight}
    try:
        for phase, gateway in gateways.items():
            await set_up(stubs[phase], gateway, topic, args.queues)
            await produce_rate(stubs[phase], gateway, topic, **load, duration_s=2.0)
        for round_index in range(args.rounds):
            order = phases if round_index % 2 == 0 else phases[::-1]
            for phase in order:
                rate, cpu_us = await produce_rate(
                    stubs[phase], gateways[phase], topic, **load, duration_s=args.duration_s
                )
                rates[phase].append(rate)
                cpu[phase].append(cpu_us)
                print(
                    f"round {round_index + 1} {phase}: {rate:,.0f} msg/s, {cpu_us:.1f} CPU us/msg",
                    flush=True,
                )
    finally:
        for channel in channels.values():
            await channel.close(None)
    return rates, cpu


def add_load_arguments(parser: argparse.ArgumentParser, *, duration_s: float, rounds: int) -> None:
    parser.add_argument("--duration-s", type=float, default=duration_s)
    parser.add_argument("--rounds", type=int, default=rounds, choices=range(1, 21))
    parser.add_argument("--queues", type=int, default=4, choices=range(1, 65))
    parser.add_argument("--inflight", type=int, default=4, choices=range(1, 257))
    parser.add_argument("--batch", type=int, default=100, choices=range(1, 1001))


def summarize(
    args: argparse.Namespace,
    started: str,
    load_before: list[float],
    measured: tuple[dict[str, list[float]], dict[str, list[float]]],
    ratios: Sequence[tuple[str, str]],
    results: Path,
) -> dict[str, Any]:
    """The summary (also written to ``results``): medians per phase and, for each
    (phase, base) in ``ratios``, the rate ratio of each round (its phases back to back)
    and their median, and the CPU-efficiency ratio (base's CPU per message / phase's)."""
    rates, cpu = measured
    summary: dict[str, Any] = {
        "args": vars(args),
        "started": started,
        "rates_msg_s": rates,
        "median_msg_s": {phase: statistics.median(values) for phase, values in rates.items()},
        "cpu_us_per_msg": cpu,
        "median_cpu_us_per_msg": {phase: statistics.median(v) for phase, v in cpu.items()},
        "loadavg": {"before": load_before, "after": loadavg()},
    }
    for phase, base in ratios:
        each = [a / b for a, b in zip(rates[phase], rates[base], strict=True) if b]
        summary[f"{phase}_over_{base}_each_round"] = each
        summary[f"{phase}_over_{base}_median"] = statistics.median(each)
        efficiency = [b / a for a, b in zip(cpu[phase], cpu[base], strict=True) if a]
        summary[f"{phase}_over_{base}_cpu_efficiency_each_round"] = efficiency
        summary[f"{phase}_over_{base}_cpu_efficiency_median"] = statistics.median(efficiency)
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps(summary, indent=2))
    return summary
