"""tests/_ports.py: the ports tests start services on never collide between xdist workers
nor with the kernel's own choices."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests._ports import SLICES, PortAllocator, free_port, slice_ports, worker_slice

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_each_worker_has_a_slice_of_its_own() -> None:
    slices = [worker_slice(None), *(worker_slice(f"gw{n}") for n in range(SLICES - 1))]
    assert slices == list(range(SLICES))
    assert worker_slice("gw5") == worker_slice("gw0")  # more workers than slices: shared
    assert worker_slice("master") == worker_slice(None)
    ports = [set(slice_ports(index)) for index in slices]
    assert all(a.isdisjoint(b) for i, a in enumerate(ports) for b in ports[i + 1 :])


def test_the_slices_lie_below_the_kernels_ephemeral_range() -> None:
    if not EPHEMERAL_RANGE.exists():
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range (not Linux)")
    ephemeral_first = int(EPHEMERAL_RANGE.read_text().split()[0])
    assert slice_ports(SLICES - 1).stop <= ephemeral_first


def test_ports_are_handed_out_in_turn_skipping_a_held_one() -> None:
    with socket.socket() as holder:
        held = free_port()
        holder.bind(("127.0.0.1", held))
        allocator = PortAllocator(range(held, held + 3), start=0)
        taken = [allocator.take() for _ in range(3)]
    # The held port skipped; the next one only after the whole range came round.
    assert taken == [held + 1, held + 2, held + 1]


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen()
