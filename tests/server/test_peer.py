"""The caller's address from grpc's peer string, for every transport."""

from __future__ import annotations

from tide.server import peer_address


def test_peer_addresses_of_every_transport() -> None:
    assert peer_address("ipv4:10.0.0.1:5000") == "10.0.0.1:5000"
    assert peer_address("ipv6:[::1]:5000") == "[::1]:5000"
    assert peer_address("ipv6:%5B::1%5D:5000") == "[::1]:5000"  # percent-encoded
    assert peer_address("unix:/tmp/socket") == ""
