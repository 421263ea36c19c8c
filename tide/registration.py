"""Rules for what a broker registers with a name server: names, addresses, broker id and
heartbeat timeout. Each check returns what is wrong (a message naming the field) or None.

The name server checks registrations with them and the storage service its own options,
so a misconfigured broker fails at start instead of being refused by every name server
(shared here: services never import each other).
"""

from __future__ import annotations

import string

from tide.limits import ADDRESS_MAX_CHARS, NAME_MAX_CHARS
from tide.quoting import quote

MAX_BROKER_ID = 2**31 - 1
# A broker may ask for a heartbeat timeout up to this long.
MAX_HEARTBEAT_TIMEOUT_MS = 86_400_000

_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "_-.")
_NAME_CHARS_TEXT = "ASCII letters, digits, '_', '-' and '.'"
_HOST_CHARS = frozenset(string.ascii_letters + string.digits + "-._:[]%")


def name_error(field: str, name: str) -> str | None:
    """A cluster or broker name: 1..64 of ``[A-Za-z0-9_.-]``."""
    if not name:
        return f"{field} is empty; give a name of 1 to {NAME_MAX_CHARS} characters"
    if len(name) > NAME_MAX_CHARS:
        return f"{field} is {len(name)} characters long; the limit is {NAME_MAX_CHARS}"
    for index, char in enumerate(name):
        if char not in _NAME_CHARS:
            return (
                f"{field} {quote(name)} contains {char!r} at index {index}; "
                f"allowed characters are {_NAME_CHARS_TEXT}"
            )
    return None


def address_error(field: str, address: str) -> str | None:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) with a port in 1..65535."""
    if not address:
        return f"{field} is empty; give HOST:PORT"
    if len(address) > ADDRESS_MAX_CHARS:
        return f"{field} is {len(address)} characters long; the limit is {ADDRESS_MAX_CHARS}"
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return f"{field} must be HOST:PORT with a port in 1..65535, got {quote(address)}"
    bad = next((char for char in host if char not in _HOST_CHARS), None)
    if bad is not None:
        return f"{field}: host {quote(host)} contains {bad!r}; give a host name or an IP address"
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        return f"{field}: write an IPv6 host in brackets, e.g. [::1]:10911, got {quote(address)}"
    return None


def broker_id_error(broker_id: int) -> str | None:
    if not 0 <= broker_id <= MAX_BROKER_ID:
        return f"broker_id is {broker_id}; it must be 0 (master) .. {MAX_BROKER_ID} (slaves > 0)"
    return None
