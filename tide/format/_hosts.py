"""Host addresses inside records and message ids: IPv4 (4 + 4 bytes) or IPv6 (16 + 4)."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from functools import lru_cache

from tide.quoting import quote

_PORT = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class HostAddress:
    ip: str
    port: int

    @property
    def is_v6(self) -> bool:
        return ":" in self.ip

    def __str__(self) -> str:
        return f"[{self.ip}]:{self.port}" if self.is_v6 else f"{self.ip}:{self.port}"


def parse_host(text: str) -> HostAddress:
    """Parse ``ip:port`` or ``[ipv6]:port``; raise ValueError with what is wrong."""
    if text.startswith("["):
        ip, sep, port = text[1:].partition("]:")
    else:
        ip, sep, port = text.rpartition(":")
    if not sep or not ip:
        raise ValueError(f"host {quote(text)} is not 'ip:port' or '[ipv6]:port'")
    try:
        addr = ipaddress.ip_address(ip)
        port_num = int(port)
    except ValueError as exc:
        raise ValueError(f"host {quote(text)}: {exc}") from None
    if not 0 <= port_num <= 65535:
        raise ValueError(f"host {quote(text)}: port {port_num} is not in 0..65535")
    return HostAddress(str(addr), port_num)


def pack_host(host: HostAddress) -> bytes:
    """4-byte IPv4 or 16-byte IPv6 address followed by a 4-byte port."""
    return ipaddress.ip_address(host.ip).packed + _PORT.pack(host.port)


def unpack_host(data: bytes) -> HostAddress:
    return _unpack_host(bytes(data))  # (any bytes-like: the cache keys on bytes)


# Records carry few distinct hosts (the store's, its producers'): a bounded cache saves
# every decode the ipaddress parse (the largest part of a small record's decode).
@lru_cache(maxsize=4096)
def _unpack_host(data: bytes) -> HostAddress:
    assert len(data) in (8, 20), len(data)
    ip = ipaddress.ip_address(data[:-4])
    (port,) = _PORT.unpack(data[-4:])
    return HostAddress(str(ip), port)
