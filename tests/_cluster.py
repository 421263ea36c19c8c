"""A whole Tide cluster of real processes for integration tests: name server(s), brokers
(a storage + dispatch pair each, registering with the name servers) and a gateway.

Use it through the fixture factory, in a conftest.py or a test module::

    from tests._cluster import Cluster, cluster_fixture

    cluster = cluster_fixture(brokers=2)            # a module-scoped fixture named "cluster"
    small = cluster_fixture(name="small", brokers=1, scope="function")

    def test_something(cluster: Cluster) -> None:
        cluster.create_topic("T_mine", queues=4)    # on every broker; waits for the route
        reply = cluster.gateway.stub.Produce(...)   # a sync tide.v1.Gateway stub
        cluster.gateway.listen                      # "127.0.0.1:PORT" for your own client

or directly: ``with Cluster(tmp_path, brokers=2) as cluster: ...``.

* Brokers are named ``broker-a``, ``broker-b``... in cluster ``TestCluster``;
  ``cluster.brokers[i]`` has ``.storage`` / ``.dispatch`` (the master's StorageProcess /
  DispatchProcess with sync stubs) and ``.stop()`` (SIGTERM every member: the broker
  unregisters) and ``.kill()`` (SIGKILL every member: the name servers drop it after
  ``BROKER_HEARTBEAT_TIMEOUT_MS``). ``cluster.broker("broker-b")`` finds one by name.
* Replication: ``Cluster(..., replicas=2, master_role="SYNC_MASTER")`` gives every broker
  a master (broker id 0, ``--role`` ``master_role``) and ``replicas - 1`` slaves (ids 1..,
  ``--role SLAVE --master`` the master's storage), each a storage + its own dispatch.
  ``broker.master`` and ``broker.slaves[i]`` are :class:`Replica` objects with
  ``.storage``, ``.dispatch``, ``.stop()``, ``.kill()``, ``.running``;
  ``cluster.restart(replica)`` starts a stopped or killed one again on the same ports and
  store (``cluster.restart_dispatch(replica)`` its dispatch alone), and
  ``cluster.add_slave(broker)`` starts one more slave (an empty store).
  ``cluster.registered_members()`` lists (broker name, id) pairs the name server knows.
* Intervals are short for tests: brokers register every ``REGISTER_INTERVAL_MS`` and
  expire ``BROKER_HEARTBEAT_TIMEOUT_MS`` after their last registration; consumer group
  members expire after ``CONSUMER_EXPIRY_MS``; the gateway refreshes routes every
  ``ROUTE_REFRESH_MS``.
* ``cluster.restart_gateway(*flags)`` replaces the gateway (e.g. other limits).
* The gateway serves /metrics (its ready file names the port):
  ``cluster.gateway.wait_held(n)`` waits until it holds ``n`` long polls.
* Waits poll observable state through ``tide.waiting.wait_until`` (no fixed sleeps).
* Every process started is killed and reaped by ``close()`` (the fixture does it), and
  each test should use topics of its own (the fixture is shared by a module by default).
"""

from __future__ import annotations

import string
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

import grpc
import pytest

from tests._metrics import SCRAPE_INTERVAL_S, scrape, total
from tests._service_process import ServiceProcess, free_port, spawn
from tests.services.dispatch.conftest import DispatchLauncher, DispatchProcess
from tests.services.nameserver.process import NameServerLauncher, NameServerProcess
from tests.services.storage.conftest import StorageLauncher, StorageProcess
from tide.tls import TlsFiles
from tide.v1 import gateway_pb2 as pb
from tide.v1 import gateway_pb2_grpc as pb_grpc
from tide.v1 import nameserver_pb2 as ns_pb
from tide.waiting import wait_until

CLUSTER_NAME = "TestCluster"


def tls_flags(tls: TlsFiles | None) -> tuple[str, ...]:
    """The ``--tls-*`` flags of a service using ``tls`` (none: plaintext)."""
    if tls is None:
        return ()
    assert tls.cert_file and tls.key_file and tls.ca_file, tls
    return (
        "--tls-cert-file",
        tls.cert_file,
        "--tls-key-file",
        tls.key_file,
        "--tls-ca-file",
        tls.ca_file,
    )


REGISTER_INTERVAL_MS = 500
BROKER_HEARTBEAT_TIMEOUT_MS = 3_000
CONSUMER_EXPIRY_MS = 5_000
SCAN_INTERVAL_MS = 200
ROUTE_REFRESH_MS = 1_000
# The storage test wrapper limits bodies to this; the gateway is told the same.
MAX_BODY_BYTES = 65_536
RPC_TIMEOUT_S = 20.0
MAX_BROKERS = 26
MAX_REPLICAS = 4
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
# Replication heartbeat: a dead peer is noticed after 4 of these.
HA_HEARTBEAT_INTERVAL_MS = 500


@dataclass
class GatewayProcess(ServiceProcess[pb_grpc.GatewayStub]):
    """A running gateway (``python -m services.gateway``) with a sync stub."""

    service: ClassVar[str] = "gateway"

    def make_stub(self, channel: grpc.Channel) -> pb_grpc.GatewayStub:
        return pb_grpc.GatewayStub(channel)

    def held_pulls(self) -> float:
        """Its ``tide_gateway_held_pulls`` gauge: the long polls it holds (sampled every
        second)."""
        return total(scrape(str(self.ready["metrics"])), "tide_gateway_held_pulls")

    def wait_held(self, count: int) -> None:
        """Until it holds ``count`` pulls (or more): wait on this, not a sleep, before
        relying on a pull being held."""
        wait_until(
            lambda: self.held_pulls() >= count,
            f"{count} held pulls",
            interval_s=SCRAPE_INTERVAL_S,
            state=lambda: f"{self.held_pulls():g} held",
        )


@dataclass
class Replica:
    """One member of a broker: a storage and the dispatch that follows it. ``storage`` and
    ``dispatch`` are replaced by :meth:`Cluster.restart`."""

    broker_name: str
    broker_id: int
    storage: StorageProcess
    dispatch: DispatchProcess
    # What restart needs: the store directories and the launch arguments.
    storage_dir: Path
    dispatch_dir: Path
    storage_args: tuple[str, ...]
    dispatch_args: tuple[str, ...]

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0

    @property
    def running(self) -> bool:
        return self.storage.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM dispatch, then storage (the storage unregisters)."""
        self.dispatch.stop()
        self.storage.stop()

    def kill(self) -> None:
        """SIGKILL storage and dispatch (a crash)."""
        self.storage.kill()
        self.dispatch.kill()


@dataclass
class Broker:
    name: str
    master: Replica
    slaves: list[Replica] = field(default_factory=list)

    @property
    def storage(self) -> StorageProcess:
        """The master's storage."""
        return self.master.storage

    @property
    def dispatch(self) -> DispatchProcess:
        """The master's dispatch."""
        return self.master.dispatch

    @property
    def members(self) -> list[Replica]:
        return [self.master, *self.slaves]

    @property
    def storage_address(self) -> str:
        return self.storage.listen

    @property
    def dispatch_address(self) -> str:
        return self.dispatch.listen

    def stop(self) -> None:
        """SIGTERM every member's dispatch and storage (slaves first)."""
        for member in reversed(self.members):
            if member.running:
                member.stop()

    def kill(self) -> None:
        """SIGKILL every member: the name servers drop the broker when its registrations
        expire."""
        for member in self.members:
            member.kill()


class Cluster:
    def __init__(
        self,
        root: Path,
        *,
        brokers: int = 2,
        nameservers: int = 1,
        gateway_args: Sequence[str] = (),
        storage_args: Sequence[str] = (),
        replicas: int = 1,
        master_role: str = "ASYNC_MASTER",
        dispatch_args: Sequence[str] = (),
        tls: TlsFiles | None = None,
        nameserver_args: Sequence[str] = (),
    ) -> None:
        if not 1 <= brokers <= MAX_BROKERS or not 1 <= nameservers <= 8:
            raise ValueError(f"brokers in 1..{MAX_BROKERS}, nameservers in 1..8")
        if not 1 <= replicas <= MAX_REPLICAS or master_role not in MASTER_ROLES:
            raise ValueError(f"replicas in 1..{MAX_REPLICAS}, master_role one of {MASTER_ROLES}")
        self.root = root
        self._replicas = replicas
        self._master_role = master_role
        self._broker_count = brokers
        self._nameserver_count = nameservers
        # TLS on every service (its certificate also the client certificate of the links
        # between them and of the harness's stubs): docs/security.md.
        self.tls = tls
        tls_args = tls_flags(tls)
        self._gateway_args = (*gateway_args, *tls_args)
        self._storage_args = (*storage_args, *tls_args)
        self._dispatch_args = (*dispatch_args, *tls_args)
        self._nameserver_args = (*nameserver_args, *tls_args)
        self._nameserver_launcher = NameServerLauncher(root / "nameservers")
        self._storage_launcher = StorageLauncher(root / "storage")
        self._dispatch_launcher = DispatchLauncher(root / "dispatch")
        self._gateways: list[GatewayProcess] = []
        self.nameservers: list[NameServerProcess] = []
        self.brokers: list[Broker] = []
        self._gateway: GatewayProcess | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> Cluster:
        for _ in range(self._nameserver_count):
            nameserver = self._nameserver_launcher.start(
                "--scan-interval-ms", str(SCAN_INTERVAL_MS), *self._nameserver_args
            )
            self._secure(nameserver)
            self.nameservers.append(nameserver)
        names = [f"broker-{letter}" for letter in string.ascii_lowercase[: self._broker_count]]
        self.start_brokers(names)
        self._gateway = self._start_gateway(self._gateway_args)
        return self

    def start_brokers(self, names: Sequence[str]) -> list[Broker]:
        """Start brokers (masters' storages first, all at once, then their dispatches, then
        the slaves likewise) and wait until the name servers list every member."""
        masters = self._start_members([(name, 0, "") for name in names])
        started = [Broker(member.broker_name, member) for member in masters]
        for broker_id in range(1, self._replicas):
            slaves = self._start_members(
                [(broker.name, broker_id, broker.master.storage.listen) for broker in started]
            )
            for broker, slave in zip(started, slaves, strict=True):
                broker.slaves.append(slave)
        self.brokers.extend(started)
        wanted = {
            (broker.name, member.broker_id) for broker in started for member in broker.members
        }
        wait_until(
            lambda: wanted <= self.registered_members(),
            f"broker members {sorted(wanted)} registered",
        )
        return started

    def add_slave(self, broker: Broker) -> Replica:
        """Start one more slave of ``broker`` on an empty store; wait until it registered."""
        broker_id = max(member.broker_id for member in broker.members) + 1
        (slave,) = self._start_members([(broker.name, broker_id, broker.master.storage.listen)])
        broker.slaves.append(slave)
        wait_until(
            lambda: (broker.name, broker_id) in self.registered_members(),
            f"slave {broker_id} of {broker.name} registered",
        )
        return slave

    def _start_members(self, wanted: Sequence[tuple[str, int, str]]) -> list[Replica]:
        """Start (broker name, broker id, master address) members: the storages at once,
        then their dispatches."""
        ports = [(free_port(), free_port()) for _ in wanted]
        plans = []
        for (name, broker_id, master), (storage_port, dispatch_port) in zip(
            wanted, ports, strict=True
        ):
            base = self.root / "stores" / name
            suffix = "" if broker_id == 0 else f"-{broker_id}"
            role = (
                ("--role", "SLAVE", "--broker-id", str(broker_id), "--master", master)
                if broker_id
                else ("--role", self._master_role)
            )
            storage_args = (
                "--listen",
                f"127.0.0.1:{storage_port}",
                "--cluster-name",
                CLUSTER_NAME,
                "--broker-name",
                name,
                *role,
                "--namesrv",
                self.namesrv,
                "--dispatch-address",
                f"127.0.0.1:{dispatch_port}",
                "--register-interval-ms",
                str(REGISTER_INTERVAL_MS),
                "--broker-heartbeat-timeout-ms",
                str(BROKER_HEARTBEAT_TIMEOUT_MS),
                "--consumer-expiry-ms",
                str(CONSUMER_EXPIRY_MS),
                "--ha-heartbeat-interval-ms",
                str(HA_HEARTBEAT_INTERVAL_MS),
                *self._storage_args,
            )
            dispatch_args = ("--listen", f"127.0.0.1:{dispatch_port}", *self._dispatch_args)
            plans.append(
                (
                    name,
                    broker_id,
                    base / f"store{suffix}",
                    base / f"dispatch{suffix}",
                    storage_args,
                    dispatch_args,
                )
            )
        storages = [
            self._storage_launcher.spawn(store_dir, *storage_args)
            for _, _, store_dir, _, storage_args, _ in plans
        ]
        for storage in storages:
            storage.wait_ready()
            self._secure(storage)
        members = []
        for (name, broker_id, store_dir, dispatch_dir, storage_args, dispatch_args), storage in zip(
            plans, storages, strict=True
        ):
            dispatch = self._dispatch_launcher.spawn(dispatch_dir, storage.listen, *dispatch_args)
            members.append(
                Replica(
                    name,
                    broker_id,
                    storage,
                    dispatch,
                    store_dir,
                    dispatch_dir,
                    storage_args,
                    dispatch_args,
                )
            )
        for member in members:
            member.dispatch.wait_ready()
            self._secure(member.dispatch)
        return members

    def restart(self, member: Replica) -> Replica:
        """Start a stopped or killed member again (same ports, same stores) and wait until
        its storage and dispatch serve. Its registration follows within
        ``REGISTER_INTERVAL_MS``."""
        if member.storage.proc.poll() is None or member.dispatch.proc.poll() is None:
            raise AssertionError(f"{member.broker_name} id {member.broker_id} still runs")
        member.storage = self._storage_launcher.start(member.storage_dir, *member.storage_args)
        member.dispatch = self._dispatch_launcher.start(
            member.dispatch_dir, member.storage.listen, *member.dispatch_args
        )
        self._secure(member.storage)
        self._secure(member.dispatch)
        return member

    def restart_dispatch(self, member: Replica) -> Replica:
        """Start a stopped or killed dispatch of a running member again (same port and
        store) and wait until it serves."""
        if member.dispatch.proc.poll() is None:
            raise AssertionError(f"the dispatch of {member.broker_name} id {member.broker_id} runs")
        member.dispatch = self._dispatch_launcher.start(
            member.dispatch_dir, member.storage.listen, *member.dispatch_args
        )
        self._secure(member.storage)
        self._secure(member.dispatch)
        return member

    def restart_storage(self, member: Replica) -> StorageProcess:
        """SIGKILL the member's storage alone and start it again (same port and store);
        its dispatch keeps running and reconnects to it."""
        member.storage.kill()
        member.storage = self._storage_launcher.start(member.storage_dir, *member.storage_args)
        self._secure(member.storage)
        return member.storage

    def _start_gateway(self, args: Sequence[str], *, listen: str = "127.0.0.1:0") -> GatewayProcess:
        workdir = self.root / f"gateway{len(self._gateways)}"
        workdir.mkdir(parents=True)
        command = (
            sys.executable,
            "-m",
            "services.gateway",
            "--listen",
            listen,
            "--namesrv",
            self.namesrv,
            "--route-refresh-interval-ms",
            str(ROUTE_REFRESH_MS),
            "--max-message-body-bytes",
            str(MAX_BODY_BYTES),
            # Its gauges (held pulls: GatewayProcess.wait_held) on a free port.
            "--metrics-listen",
            "127.0.0.1:0",
            *args,
        )
        proc = spawn(command, workdir)
        gateway = GatewayProcess(proc, workdir, workdir, command)
        self._gateways.append(gateway)
        gateway.wait_ready()
        self._secure(gateway)
        return gateway

    def _secure(self, process: ServiceProcess[Any]) -> None:
        if self.tls is not None:
            process.use_tls(self.tls)

    def add_gateway(self, *args: str, listen: str = "127.0.0.1:0") -> GatewayProcess:
        """Start another gateway beside the current one (``gateway`` stays the current;
        both serve; ``close`` reaps both)."""
        return self._start_gateway(args, listen=listen)

    def restart_gateway(self, *args: str, kill: bool = False) -> GatewayProcess:
        """Stop (``kill``: SIGKILL, a crash) the gateway and start another with these
        extra flags."""
        if self._gateway is not None:
            if kill:
                self._gateway.kill()
            else:
                self._gateway.stop()
        self._gateway = self._start_gateway(args)
        return self._gateway

    def close(self) -> None:
        """Kill and reap every process started (never fails)."""
        for gateway in self._gateways:
            gateway.reap()
        self._dispatch_launcher.close()
        self._storage_launcher.close()
        self._nameserver_launcher.close()

    def __enter__(self) -> Cluster:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- access --------------------------------------------------------------------
    @property
    def gateway(self) -> GatewayProcess:
        if self._gateway is None:
            raise AssertionError("the cluster is not started")
        return self._gateway

    @property
    def namesrv(self) -> str:
        """The name servers as a --namesrv value ("a;b")."""
        return ";".join(process.listen for process in self.nameservers)

    def broker(self, name: str) -> Broker:
        for broker in self.brokers:
            if broker.name == name:
                return broker
        raise KeyError(name)

    def registered_brokers(self) -> set[str]:
        """Broker names the first name server lists now."""
        info: ns_pb.ClusterInfo = self.nameservers[0].cluster_info()
        return {live.broker_name for live in info.brokers}

    def registered_members(self) -> set[tuple[str, int]]:
        """(broker name, broker id) of every member the first name server lists now."""
        info: ns_pb.ClusterInfo = self.nameservers[0].cluster_info()
        return {(live.broker_name, live.broker_id) for live in info.brokers}

    # -- helpers -------------------------------------------------------------------
    def create_topic(
        self,
        topic: str,
        queues: int = 4,
        brokers: Sequence[str] = (),
        perm: int = 0,
        message_type: str = "",
    ) -> list[str]:
        """CreateTopic through the gateway (every broker unless named); returns the
        brokers it was created on (the route shows it when this returns). Delayed and
        timed messages need ``message_type="DELAY"`` (or MIXED)."""
        reply = self.gateway.stub.CreateTopic(
            pb.CreateTopicRequest(
                topic=topic,
                read_queue_nums=queues,
                write_queue_nums=queues,
                perm=perm,
                broker_names=list(brokers),
                message_type=message_type,
            ),
            timeout=RPC_TIMEOUT_S,
        )
        return list(reply.broker_names)

    def queue_max(self, topic: str, broker_name: str = "broker-a", queue_id: int = 0) -> int:
        """The queue's max offset as the gateway reports it (its dispatch's)."""
        reply = self.gateway.stub.GetQueueOffsets(
            pb.QueueOffsetsRequest(topic=topic, broker_name=broker_name, queue_id=queue_id),
            timeout=RPC_TIMEOUT_S,
        )
        return int(reply.max_offset)

    def wait_dispatched(
        self, topic: str, count: int, broker_name: str = "broker-a", queue_id: int = 0
    ) -> None:
        """The dispatch builds the consume queue after the store write (a pull right after
        a produce may see none of it): wait until the queue holds ``count`` messages."""
        wait_until(
            lambda: self.queue_max(topic, broker_name, queue_id) >= count,
            f"{count} message(s) of {topic} dispatched to {broker_name} queue {queue_id}",
            state=lambda: self.queue_max(topic, broker_name, queue_id),
        )


def cluster_fixture(
    *,
    name: str = "cluster",
    brokers: int = 2,
    nameservers: int = 1,
    scope: Any = "module",
    gateway_args: Sequence[str] = (),
    storage_args: Sequence[str] = (),
    replicas: int = 1,
    master_role: str = "ASYNC_MASTER",
    dispatch_args: Sequence[str] = (),
) -> Any:
    """A pytest fixture named ``name`` yielding a started :class:`Cluster` (see the module
    docstring); assign it to a module-level variable of a conftest or test module."""

    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
        root = tmp_path_factory.mktemp(name)
        with Cluster(
            root,
            brokers=brokers,
            nameservers=nameservers,
            gateway_args=gateway_args,
            storage_args=storage_args,
            replicas=replicas,
            master_role=master_role,
            dispatch_args=dispatch_args,
        ) as cluster:
            yield cluster

    return pytest.fixture(scope=scope, name=name)(fixture)
