"""The caller's address from grpc's ``context.peer()``."""

from __future__ import annotations

from urllib.parse import unquote


def peer_address(peer: str) -> str:
    """``ip:port`` or ``[ipv6]:port`` of ``context.peer()`` (``ipv4:1.2.3.4:5``,
    ``ipv6:[::1]:5``, which grpc may percent-encode); empty for a transport without an
    IP address (a Unix socket)."""
    kind, _, address = peer.partition(":")
    if kind == "ipv4":
        return address
    if kind == "ipv6":
        return unquote(address)
    return ""
