"""Ports for services a test must start on a port it knows beforehand (a restart on the
same port, an address given to another process first, an address nothing listens on).

Everything else listens on port 0 and reports the bound port in its ready file: prefer
that. A port found by binding port 0 and releasing it can be taken again at once by any
other bind(0) or outgoing connection on the machine (the kernel's ephemeral range), e.g.
by a service of the other pytest-xdist worker. So these ports come from below that range,
where the kernel never hands one out by itself, and each xdist worker (PYTEST_XDIST_WORKER
``gwN``) has a slice of its own: two workers never pick the same port. Within a slice a
process never hands out a port twice (it walks the slice from a random start, which also
keeps two separate test runs on one machine apart) and skips any port something holds.
"""

from __future__ import annotations

import os
import random
import re
import socket
import threading

FIRST_PORT = 20_000  # above the usual fixed service ports (9876, 10911, 8080, 8081, ...)
SLICE_PORTS = 2_000
# The slices end below the ephemeral range's usual start (32768): slice 0 for a run
# without xdist, then gw0, gw1, ...; more workers than slices share them round-robin.
SLICES = 6


def worker_slice(worker: str | None) -> int:
    """The slice of ``worker`` (PYTEST_XDIST_WORKER, e.g. ``gw1``; None: no xdist)."""
    match = re.fullmatch(r"gw(\d+)", worker or "")
    if match is None:
        return 0
    return 1 + int(match.group(1)) % (SLICES - 1)


def slice_ports(index: int) -> range:
    first = FIRST_PORT + index * SLICE_PORTS
    return range(first, first + SLICE_PORTS)


class PortAllocator:
    """Hands out the ports of one slice in turn, each checked free when handed out."""

    def __init__(self, ports: range, start: int) -> None:
        self._ports = ports
        self._next = start % len(ports)
        self._lock = threading.Lock()  # tests may start services from several threads

    def take(self) -> int:
        with self._lock:
            for _ in range(len(self._ports)):
                port = self._ports[self._next]
                self._next = (self._next + 1) % len(self._ports)
                if is_free(port):
                    return port
        raise RuntimeError(f"no free port in {self._ports.start}-{self._ports.stop - 1}")


def is_free(port: int) -> bool:
    """Nothing holds ``port`` on 127.0.0.1 (no listener, no socket bound to it)."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _allocator() -> PortAllocator:
    ports = slice_ports(worker_slice(os.environ.get("PYTEST_XDIST_WORKER")))
    return PortAllocator(ports, random.randrange(len(ports)))


_PORTS = _allocator()


def free_port() -> int:
    """A port of this worker's slice that nothing holds now and that this process has not
    handed out recently (it cycles through its 2,000)."""
    return _PORTS.take()
