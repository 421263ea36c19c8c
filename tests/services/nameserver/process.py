"""Real name server processes for the integration tests (no mocks), also used by the
storage's registration tests and ``tide up``'s."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import grpc

from tests._service_process import ServiceProcess, spawn
from tide.v1 import nameserver_pb2 as pb
from tide.v1 import nameserver_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[3]
RPC_TIMEOUT_S = 20.0


@dataclass
class NameServerProcess(ServiceProcess[pb_grpc.NameServerStub]):
    service: ClassVar[str] = "nameserver"

    def make_stub(self, channel: grpc.Channel) -> pb_grpc.NameServerStub:
        return pb_grpc.NameServerStub(channel)

    def cluster_info(self) -> pb.ClusterInfo:
        return self.stub.GetClusterInfo(pb.GetClusterInfoRequest(), timeout=RPC_TIMEOUT_S)

    def route(self, topic: str) -> pb.TopicRoute:
        return self.stub.GetTopicRoute(pb.GetTopicRouteRequest(topic=topic), timeout=RPC_TIMEOUT_S)

    def topics(self) -> list[str]:
        reply = self.stub.ListRouteTopics(pb.ListRouteTopicsRequest(), timeout=RPC_TIMEOUT_S)
        return list(reply.topics)

    def members(self) -> list[tuple[str, int, str, str]]:
        """(broker name, broker id, storage, dispatch) of every live member."""
        return [
            (b.broker_name, b.broker_id, b.address.storage, b.address.dispatch)
            for b in self.cluster_info().brokers
        ]


class NameServerLauncher:
    """Starts name server processes; ``close`` kills whatever is still running."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.started: list[NameServerProcess] = []

    def start(self, *extra: str) -> NameServerProcess:
        workdir = self.root / f"nameserver{len(self.started)}"
        workdir.mkdir(parents=True)
        args = (
            sys.executable,
            "-m",
            "services.nameserver",
            "--listen",
            "127.0.0.1:0",
            *extra,
        )
        proc = spawn(args, workdir)
        process = NameServerProcess(proc, workdir, workdir, args)
        self.started.append(process)
        process.wait_ready()
        return process

    def close(self) -> None:
        for process in self.started:
            process.reap()
