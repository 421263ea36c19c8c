"""The name server's options (flags, TIDE_NAMESERVER_* environment, config file)."""

from __future__ import annotations

from services.nameserver.route_info import (
    DEFAULT_BROKER_EXPIRY_MS,
    DEFAULT_MAX_BROKERS,
    DEFAULT_MAX_TOPICS_PER_REGISTRATION,
)
from tide.registration import MAX_HEARTBEAT_TIMEOUT_MS
from tide.server import Config, Option

DEFAULT_LISTEN = "127.0.0.1:9876"

OPTIONS: tuple[Option, ...] = (
    Option("listen", str, DEFAULT_LISTEN, "address to serve gRPC on (HOST:PORT; port 0 picks one)"),
    Option(
        "broker_expiry_ms",
        int,
        DEFAULT_BROKER_EXPIRY_MS,
        "drop a broker not registered for this long, unless it asked for another timeout",
        unit="ms",
    ),
    Option(
        "scan_interval_ms",
        int,
        10_000,
        "how often silent brokers are looked for",
        unit="ms",
    ),
    Option(
        "max_brokers",
        int,
        DEFAULT_MAX_BROKERS,
        "most broker members (masters and slaves) held; more are refused",
        unit="brokers",
    ),
    Option(
        "max_topics_per_registration",
        int,
        DEFAULT_MAX_TOPICS_PER_REGISTRATION,
        "most topics one broker registration may list",
        unit="topics",
    ),
)


def check_config(config: Config) -> str | None:
    """What is wrong with the option values (None: nothing), checked before starting."""
    ranges = {
        "broker_expiry_ms": (1, MAX_HEARTBEAT_TIMEOUT_MS),
        "scan_interval_ms": (1, 3_600_000),
        "max_brokers": (1, 1_000_000),
        "max_topics_per_registration": (1, 10_000_000),
    }
    return config.int_out_of_range(ranges)
