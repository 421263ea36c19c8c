"""``tide up``: a local cluster on one machine, for development and tests.

Starts a name server, ``--brokers`` storage + dispatch pairs (registered with the name
server as broker-a, broker-b, ...) and a gateway, each as a child process on
``--host``, waits until each reports SERVING (through its ready file), prints the
endpoints, and stops them all cleanly on Ctrl-C or SIGTERM: the gateway first, then the
dispatches, the storages (which unregister from the name server) and the name server.

Ports: name server 9876, gateway 8081; broker i (0 for broker-a) gets storage
``--storage-port + 100*i`` and dispatch ``--dispatch-port + 100*i`` (10911/10921,
11011/11021, ...). A port of 0 means any free port (for dispatches it is picked up
front: the storage must be told its dispatch's address). Stores: ``<store-dir>/store``
with one broker, ``<store-dir>/broker-a``, ``<store-dir>/broker-b``, ... with more; each
holds the storage's commitlog/ and config/ and the dispatch's consumequeue/ and index/
(RocketMQ's layout).

Replication: ``--replicas N`` (1..4) gives every broker a master (broker id 0, ``--role``
from ``--master-role``) and N-1 slaves (ids 1..N-1, ``--role SLAVE --master`` the
master's storage), each slave with a dispatch of its own. Slave j of a broker listens on
the master's storage and dispatch ports + j (10912/10922 for broker-a's slave 1, 11012/
11022 for broker-b's): the +100 step per broker and the 10 between storage and
dispatch ports leave room for them. A slave's store is the master's directory with
``-<id>`` appended (``<store-dir>/store-1``, ``<store-dir>/broker-a-1``, ...). Slaves start
after their master and stop before it.

The gateway is started only when ``services/gateway`` has a ``__main__.py``. The web
console (``services/console``, docs/console.md) starts last, on ``--console-listen``
(default ``HOST:8080``), told the gateway and every service's Prometheus endpoint for its
charts, and stops first; ``--no-console`` leaves it out.

Children run in their own process group, so a terminal's Ctrl-C reaches only ``tide
up``, which then sends each child exactly one SIGTERM (a second signal would make a
service exit without its clean close).
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import socket
import string
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from tide.cli import _up_auth
from tide.spawn import NotReadyError, WaitCancelled, spawn, wait_ready
from tide.tls import TlsFiles

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.05
DEFAULT_SEGMENT_SIZE_BYTES = 128 << 20
DEFAULT_INDEX_MAX_ENTRIES = 1_000_000  # a 20 MB index file for a laptop-sized cluster
BROKER_PORT_STEP = 100
MAX_BROKERS = 26  # broker-a .. broker-z
# Master + slaves per broker; a slave's ports are its master's + its id, so ids stay
# below the 10 between storage and dispatch ports.
MAX_REPLICAS = 4
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
CLUSTER_NAME = "DefaultCluster"


def _services_dir() -> Path:
    """Where the ``services`` package is, found without importing it (tide never imports
    services: they are started as processes, ``python -m services.X``)."""
    spec = importlib.util.find_spec("services")
    locations = spec.submodule_search_locations if spec is not None else None
    if not locations:
        raise RuntimeError("the services package is not installed beside tide")
    return Path(next(iter(locations))).resolve()


GATEWAY_MAIN = _services_dir() / "gateway" / "__main__.py"
CONSOLE_MAIN = _services_dir() / "console" / "__main__.py"
CONSOLE_PORT = 8080

# Stop order: lower stages stop (and finish stopping) first.
STAGE_CONSOLE = -1  # the console (a client of the gateway) stops before it
STAGE_GATEWAY, STAGE_DISPATCH, STAGE_SLAVE_STORAGE, STAGE_STORAGE, STAGE_NAMESERVER = range(5)


@dataclass
class Child:
    name: str
    command: list[str]
    ready_file: Path
    stage: int
    process: subprocess.Popen[bytes] | None = None
    endpoint: str = ""
    metrics: str = ""  # HOST:PORT of its Prometheus endpoint
    serves_metrics: bool = True  # takes --metrics-listen (the console does not)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "up",
        help="start a local cluster (Ctrl-C stops it)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("--store-dir", default="./.tide", help="root of the embedded stores")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="TLS everywhere (mutual TLS between the services) with a throwaway CA and "
        "certificate made under STORE_DIR/tls (default: plaintext)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address every service listens on")
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help=f"storage + dispatch pairs (broker-a, broker-b, ...; 1..{MAX_BROKERS})",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=1,
        help=f"storage + dispatch pairs per broker: a master and N-1 slaves (1..{MAX_REPLICAS}; "
        "slave j listens on its master's ports + j)",
    )
    parser.add_argument(
        "--master-role",
        choices=MASTER_ROLES,
        default="ASYNC_MASTER",
        help="the masters' --role: SYNC_MASTER answers a produce once a slave has it "
        "(needs --replicas 2 or more; default: ASYNC_MASTER)",
    )
    ports = (
        ("namesrv", 9876, "name server"),
        ("storage", 10911, "first storage (broker i: + 100*i)"),
        ("dispatch", 10921, "first dispatch (broker i: + 100*i)"),
        ("gateway", 8081, "gateway"),
    )
    for name, default, what in ports:
        parser.add_argument(
            f"--{name}-port",
            type=int,
            default=default,
            help=f"{what} gRPC port (0: any free port; default: {default})",
        )
    parser.add_argument(
        "--index-max-entries",
        type=int,
        default=DEFAULT_INDEX_MAX_ENTRIES,
        help=f"entries per index file [unit: entries] (default: {DEFAULT_INDEX_MAX_ENTRIES}; "
        "RocketMQ's 20,000,000 makes a 420 MB file)",
    )
    parser.add_argument("--flush", choices=("sync", "async"), default="async", help="flush policy")
    parser.add_argument(
        "--segment-size-bytes",
        type=int,
        default=DEFAULT_SEGMENT_SIZE_BYTES,
        help=f"commitlog segment size [unit: bytes] (default: {DEFAULT_SEGMENT_SIZE_BYTES})",
    )
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    parser.add_argument(
        "--console-listen",
        metavar="HOST:PORT",
        help=f"where the web console listens (default: HOST:{CONSOLE_PORT}; port 0: any free port)",
    )
    parser.add_argument("--no-console", action="store_true", help="do not start the web console")
    parser.add_argument(
        "--auth",
        action="store_true",
        help="authentication and ACLs on, with a generated admin user and cluster secret "
        "(kept under STORE_DIR/auth; docs/security.md)",
    )
    parser.set_defaults(handler=run)


def _check_args(args: argparse.Namespace) -> str | None:
    if not 1 <= args.brokers <= MAX_BROKERS:
        return f"--brokers is {args.brokers}; it must be 1..{MAX_BROKERS}"
    if not 1 <= args.replicas <= MAX_REPLICAS:
        return f"--replicas is {args.replicas}; it must be 1..{MAX_REPLICAS}"
    if args.master_role == "SYNC_MASTER" and args.replicas < 2:
        return (
            "--master-role SYNC_MASTER needs --replicas 2 or more: without a slave every "
            "produce would answer SLAVE_NOT_AVAILABLE"
        )
    last = BROKER_PORT_STEP * (args.brokers - 1) + args.replicas - 1
    for name in ("namesrv", "storage", "dispatch", "gateway"):
        port = getattr(args, f"{name}_port")
        top = port + (last if name in ("storage", "dispatch") and port else 0)
        if port < 0 or top > 65535:
            return f"--{name}-port {port}: ports must be 0..65535 for every broker"
    return None


def _reachable(host: str) -> str:
    """The host clients use for a service listening on ``host``."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "[::]", "::") else host


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((_reachable(host), 0))
        port: int = probe.getsockname()[1]
        return port


def _broker_port(base: int, index: int, broker_id: int = 0) -> int:
    """Broker ``index``'s member ``broker_id`` port (0 stays 0: any free port)."""
    return base + BROKER_PORT_STEP * index + broker_id if base else 0


def _children(args: argparse.Namespace) -> list[Child]:
    """Name server, then each broker's storage and dispatch, then the gateway. ``{name}``
    in a command stands for the endpoint of the earlier child ``name``."""
    root = Path(args.store_dir).resolve()
    run_dir = root / "run"
    common = ["--log-level", args.log_level]
    python = [sys.executable, "-m"]
    children = [
        Child(
            "nameserver",
            [
                *python,
                "services.nameserver",
                "--listen",
                f"{args.host}:{args.namesrv_port}",
                *common,
            ],
            run_dir / "nameserver.ready",
            STAGE_NAMESERVER,
        )
    ]
    for index in range(args.brokers):
        for broker_id in range(args.replicas):
            children += _member_children(args, index, broker_id)
    if GATEWAY_MAIN.exists():
        gateway = [
            *python,
            "services.gateway",
            "--listen",
            f"{args.host}:{args.gateway_port}",
            "--namesrv",
            "{nameserver}",
            *common,
        ]
        children.append(Child("gateway", gateway, run_dir / "gateway.ready", STAGE_GATEWAY))
    return children


def _console_child(args: argparse.Namespace, children: list[Child], tls: TlsFiles | None) -> Child:
    """The web console: the gateway's client, shown every service's metrics endpoint."""
    run_dir = Path(args.store_dir).resolve() / "run"
    listen = args.console_listen or f"{args.host}:{CONSOLE_PORT}"
    command = [
        sys.executable,
        "-m",
        "services.console",
        "--listen",
        listen,
        "--gateway",
        "{gateway}",
        "--log-level",
        args.log_level,
    ]
    for child in children:
        name = _member_name(child.command) if child.name.startswith("storage") else child.name
        command += ["--metrics-endpoint", f"{name}={{{child.name}.metrics}}"]
    command += _tls_flags(tls)
    return Child("console", command, run_dir / "console.ready", STAGE_CONSOLE, serves_metrics=False)


def _member_name(command: list[str]) -> str:
    """A storage's broker member as the console's cluster page looks its metrics up:
    ``broker-a`` (a master), ``broker-a-1`` (its slave 1)."""
    broker = command[command.index("--broker-name") + 1]
    if "--broker-id" in command:
        return f"{broker}-{command[command.index('--broker-id') + 1]}"
    return broker


def _member_children(args: argparse.Namespace, index: int, broker_id: int) -> list[Child]:
    """The storage and dispatch of broker ``index``'s member ``broker_id`` (0: master)."""
    root = Path(args.store_dir).resolve()
    run_dir = root / "run"
    common = ["--log-level", args.log_level]
    python = [sys.executable, "-m"]
    letter = string.ascii_lowercase[index]
    master_suffix = "" if args.brokers == 1 else f"-{letter}"
    suffix = master_suffix + (f"-{broker_id}" if broker_id else "")
    master_store = root / ("store" if args.brokers == 1 else f"broker-{letter}")
    store = (
        master_store.with_name(f"{master_store.name}-{broker_id}") if broker_id else master_store
    )
    dispatch_port = _broker_port(args.dispatch_port, index, broker_id) or _free_port(args.host)
    role = (
        [
            "--role",
            "SLAVE",
            "--broker-id",
            str(broker_id),
            "--master",
            f"{{storage{master_suffix}}}",
        ]
        if broker_id
        else ["--role", args.master_role]
    )
    storage = [
        *python,
        "services.storage",
        "--store-dir",
        str(store),
        "--listen",
        f"{args.host}:{_broker_port(args.storage_port, index, broker_id)}",
        "--flush",
        args.flush,
        "--segment-size-bytes",
        str(args.segment_size_bytes),
        "--cluster-name",
        CLUSTER_NAME,
        "--broker-name",
        f"broker-{letter}",
        *role,
        "--namesrv",
        "{nameserver}",
        "--dispatch-address",
        f"{_reachable(args.host)}:{dispatch_port}",
        *common,
    ]
    dispatch = [
        *python,
        "services.dispatch",
        "--store-dir",
        str(store),
        "--listen",
        f"{args.host}:{dispatch_port}",
        "--storage",
        f"{{storage{suffix}}}",
        "--index-max-entries",
        str(args.index_max_entries),
        "--index-slot-count",
        str(max(1, args.index_max_entries // 4)),
        *common,
    ]
    storage_stage = STAGE_SLAVE_STORAGE if broker_id else STAGE_STORAGE
    return [
        Child(f"storage{suffix}", storage, run_dir / f"storage{suffix}.ready", storage_stage),
        Child(f"dispatch{suffix}", dispatch, run_dir / f"dispatch{suffix}.ready", STAGE_DISPATCH),
    ]


class _Stop:
    """Set by SIGINT/SIGTERM."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum


def run(args: argparse.Namespace) -> int:
    problem = _check_args(args)
    if problem is not None:
        print(f"tide up: {problem}", file=sys.stderr)
        return 2
    children = _children(args)
    tls = _make_certificates(args) if args.tls else None
    for child in children:
        child.command += _tls_flags(tls)
    root = Path(args.store_dir).resolve()
    admin_secret = _up_auth.add_flags(children, root) if args.auth else None
    if CONSOLE_MAIN.exists() and GATEWAY_MAIN.exists() and not args.no_console:
        # After the auth flags: the console holds no cluster secret (it is a client).
        children.append(_console_child(args, children, tls))
    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if not _start_all(children, stop):
            return 1
        if admin_secret is not None:
            _up_auth.print_admin(admin_secret)
        _print_endpoints(children, root, tls)
        return _watch(children, stop)
    finally:
        _stop_all(children)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _substitute(arg: str, endpoints: dict[str, str]) -> str:
    for name, endpoint in endpoints.items():
        arg = arg.replace("{" + name + "}", endpoint)
    return arg


def _start_all(children: list[Child], stop: _Stop) -> bool:
    """Start each child once the ones before it are ready (all within READY_TIMEOUT_S)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    endpoints: dict[str, str] = {}
    for child in children:
        child.ready_file.parent.mkdir(parents=True, exist_ok=True)
        command = [_substitute(arg, endpoints) for arg in child.command]
        # Prometheus metrics on a free port of the same host (the ready file names it).
        listen_host = command[command.index("--listen") + 1].rpartition(":")[0]
        if child.serves_metrics:
            command += ["--metrics-listen", f"{listen_host}:0"]
        child.process = spawn(command, child.ready_file, start_new_session=True)
        try:
            ready = wait_ready(
                child.process,
                child.ready_file,
                child.name,
                max(0.0, deadline - time.monotonic()),
                cancelled=lambda: stop.signal is not None,
            )
        except WaitCancelled:
            return False
        except NotReadyError as exc:
            # Its stderr is this terminal's: the log is above.
            print(f"tide up: {exc} (its log is above)", file=sys.stderr)
            return False
        listen = str(ready["listen"])
        host, _, port = listen.rpartition(":")
        child.endpoint = f"{_reachable(host)}:{port}"
        metrics_host, _, metrics_port = str(ready.get("metrics", "")).rpartition(":")
        if metrics_host:
            child.metrics = f"{_reachable(metrics_host)}:{metrics_port}"
        endpoints[child.name] = child.endpoint
        endpoints[f"{child.name}.metrics"] = child.metrics
    return True


def _make_certificates(args: argparse.Namespace) -> TlsFiles:
    """A throwaway CA and one certificate (server and client) for every service, valid for
    ``--host``, localhost and 127.0.0.1; made anew at each start (a CA per run)."""
    from tide.certs import LOCAL_HOSTS, make_ca, make_leaf  # cryptography: only with --tls

    directory = Path(args.store_dir).resolve() / "tls"
    authority = make_ca(directory, "tide-up-ca")
    hosts = tuple(dict.fromkeys((*LOCAL_HOSTS, args.host, _reachable(args.host))))
    leaf = make_leaf(authority, directory, "tide-up-cluster", hosts)
    return TlsFiles(str(leaf.cert_file), str(leaf.key_file), str(leaf.ca_file))


def _tls_flags(tls: TlsFiles | None) -> list[str]:
    if tls is None:
        return []
    assert tls.cert_file and tls.key_file and tls.ca_file
    return [
        "--tls-cert-file",
        tls.cert_file,
        "--tls-key-file",
        tls.key_file,
        "--tls-ca-file",
        tls.ca_file,
    ]


def _print_tls(tls: TlsFiles, gateway: str) -> None:
    print("TLS is on (a throwaway CA; mutual TLS between the services):", flush=True)
    print(f"  CA file     {tls.ca_file}", flush=True)
    print(f"  certificate {tls.cert_file} (key {tls.key_file})", flush=True)
    print(f"Clients: export TIDE_TLS_CA_FILE={tls.ca_file} TIDE_GATEWAY={gateway}", flush=True)
    print(f"  Python: Producer({gateway!r}, tls=TlsFiles(ca_file={tls.ca_file!r}))", flush=True)
    print(f"  grpcurl -cacert {tls.ca_file} {gateway} list", flush=True)


def _print_endpoints(children: list[Child], root: Path, tls: TlsFiles | None = None) -> None:
    print(f"\nTide is up (stores under {root}):", flush=True)
    for child in children:
        print(f"  {child.name:<12} {child.endpoint}", flush=True)
    by_name = {child.name: child.endpoint for child in children}
    first = by_name.get("gateway") or by_name.get("storage") or by_name["storage-a"]
    if "console" in by_name:
        scheme = "https" if tls is not None else "http"
        print(f"Web console: {scheme}://{by_name['console']}/", flush=True)
    print("Prometheus scrape endpoints:", flush=True)
    for child in children:
        if child.metrics:
            print(f"  {child.name:<12} metrics http://{child.metrics}/metrics", flush=True)
    if tls is not None:
        _print_tls(tls, first)
    else:
        print("Try: grpcurl -plaintext", first, "list", flush=True)
        print(
            "     grpcurl -plaintext",
            by_name["nameserver"],
            "tide.v1.NameServer/GetClusterInfo",
            flush=True,
        )
    if "gateway" not in by_name:
        print("(no gateway: services/gateway/__main__.py does not exist yet)", flush=True)
    print("Ctrl-C stops the cluster.\n", flush=True)


def _watch(children: list[Child], stop: _Stop) -> int:
    while stop.signal is None:
        for child in children:
            assert child.process is not None
            code = child.process.poll()
            if code is not None:
                print(
                    f"tide up: {child.name} exited unexpectedly with status {code}; "
                    "stopping the others",
                    file=sys.stderr,
                )
                return 1
        time.sleep(POLL_INTERVAL_S * 4)
    print(f"\ntide up: {signal.Signals(stop.signal).name}: stopping", file=sys.stderr, flush=True)
    return 0


def _stop_all(children: list[Child]) -> None:
    """Stage by stage (gateway, dispatches, storages, name server): SIGTERM each running
    child of the stage once, wait for them, SIGKILL stragglers, then the next stage."""
    for stage in sorted({child.stage for child in children}):
        running = [
            c for c in children if c.stage == stage and c.process and c.process.poll() is None
        ]
        for child in running:
            assert child.process is not None
            child.process.send_signal(signal.SIGTERM)
        for child in running:
            _wait_stopped(child)


def _wait_stopped(child: Child) -> None:
    assert child.process is not None
    try:
        code = child.process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        print(
            f"tide up: {child.name} did not stop in {STOP_TIMEOUT_S:.0f} s; killing it",
            file=sys.stderr,
        )
        child.process.kill()
        code = child.process.wait()
    if code != 0:
        print(f"tide up: {child.name} stopped with status {code}", file=sys.stderr)
