"""The gateway's options (flags, TIDE_GATEWAY_* environment, config file)."""

from __future__ import annotations

from dataclasses import dataclass

from services.gateway.append_queue import MAX_APPENDS_IN_FLIGHT
from services.gateway.produce_stream import DEFAULT_PRODUCE_STREAM_IN_FLIGHT_BYTES
from tide.limits import MESSAGE_BODY_MAX_BYTES, PRODUCE_MESSAGES_MAX, QUEUE_NUMS_MAX
from tide.server import Config, Option

DEFAULT_LISTEN = "127.0.0.1:8081"
DEFAULT_NAMESRV = "127.0.0.1:9876"
MIB = 1024 * 1024
MAX_QUEUE_NUMS = QUEUE_NUMS_MAX  # one limit for every service (tide.limits)
MAX_IN_FLIGHT_LIMIT_BYTES = 64 * 1024 * MIB

OPTIONS: tuple[Option, ...] = (
    Option("listen", str, DEFAULT_LISTEN, "address to serve gRPC on (HOST:PORT; port 0 picks one)"),
    Option(
        "namesrv",
        str,
        DEFAULT_NAMESRV,
        "name servers, HOST:PORT separated by ';' (each is tried when another fails)",
    ),
    Option(
        "route_refresh_interval_ms",
        int,
        30_000,
        "how often cached topic routes and cluster info are fetched again",
        unit="ms",
    ),
    Option(
        "max_cached_topics",
        int,
        10_000,
        "topic routes kept in the cache (the least recently used go first)",
        unit="topics",
    ),
    Option(
        "auto_create_topics",
        bool,
        False,
        "Produce to an unknown topic creates it on every master broker (off: NOT_FOUND)",
    ),
    Option(
        "default_queue_nums",
        int,
        4,
        "read and write queues per broker of an auto-created topic",
        unit="queues",
    ),
    Option(
        "produce_retries",
        int,
        2,
        "times the messages for a broker that failed (UNAVAILABLE, DEADLINE_EXCEEDED) are "
        "sent again to another broker",
        unit="retries",
    ),
    Option(
        "max_produce_messages",
        int,
        1_000,
        "most messages in one Produce call",
        unit="messages",
    ),
    Option(
        "max_message_body_bytes",
        int,
        4 * MIB,
        "largest message body accepted (at most 33554432: MESSAGE_BODY_MAX_BYTES)",
        unit="bytes",
    ),
    Option(
        "max_produce_in_flight_bytes",
        int,
        # A request is held as received and as the records it becomes (about twice its
        # size): 128 MiB keeps a gateway under the 512 MiB of deploy/k8s.
        128 * MIB,
        "bytes of the produce requests (Produce calls and ProduceStream requests) processed "
        "at once by this gateway; a request past it gets RESOURCE_EXHAUSTED (in-band on a "
        "ProduceStream) and is not processed",
        unit="bytes",
    ),
    Option(
        "max_produce_stream_in_flight_bytes",
        int,
        DEFAULT_PRODUCE_STREAM_IN_FLIGHT_BYTES,
        "bytes of one ProduceStream's requests processed at once; at it the gateway stops "
        "reading the stream until answers free room (backpressure)",
        unit="bytes",
    ),
    Option(
        "topic_message_type_check",
        bool,
        True,
        "refuse a message whose type (NORMAL, FIFO, DELAY, TRANSACTION) is not its topic's "
        "message type, unless the topic is MIXED (RocketMQ's enableTopicMessageTypeCheck)",
    ),
    Option(
        "send_latency_fault",
        bool,
        True,
        "avoid a broker for a while after it failed or answered slowly "
        "(RocketMQ's sendLatencyFaultEnable)",
    ),
    Option(
        "fault_isolation_ms",
        int,
        30_000,
        "how long a broker whose Append failed (unreachable, timed out) is avoided, and how "
        "long reads of a broker whose master is unreachable go to its slave",
        unit="ms",
    ),
    Option(
        "max_held_pulls",
        int,
        100_000,
        "long-polling pulls held at once; more get RESOURCE_EXHAUSTED",
        unit="pulls",
    ),
    Option(
        "max_held_receives",
        int,
        10_000,
        "POP Receives held at once waiting for messages (each watches its topic's queues); "
        "more get RESOURCE_EXHAUSTED",
        unit="receives",
    ),
    Option(
        "max_long_poll_ms",
        int,
        30_000,
        "largest long_poll_timeout_ms a Pull may ask for",
        unit="ms",
    ),
    Option(
        "long_poll_recheck_interval_ms",
        int,
        5_000,
        "held pulls also look at their queues this often (in case an arrival notice was missed)",
        unit="ms",
    ),
    Option(
        "max_pull_bytes",
        int,
        4 * MIB,
        "a Pull answer stops adding messages past this many record bytes (at least one)",
        unit="bytes",
    ),
    Option(
        "max_arrived_records_bytes",
        int,
        # 16 queues' worth of --max-pull-bytes (4 MiB): a consumer that keeps up trails the
        # end of each queue it pulls by about one pull.
        64 * MIB,
        "record bytes kept from the dispatches' arrival notices so that the records pulls "
        "after them are answered without asking the dispatch (each queue keeps at most "
        "--max-pull-bytes, for 30 s); 0 keeps none",
        unit="bytes",
    ),
    Option(
        "max_pull_in_flight_bytes",
        int,
        # 64 pulls reading --max-pull-bytes (4 MiB) at once; a consumer pulls a few queues
        # at a time, so this is many consumers' worth before anyone waits.
        256 * MIB,
        "bytes of the Pull answers being read at once by this gateway (each pull counts "
        "--max-pull-bytes while it reads); at it a pull waits for room (backpressure)",
        unit="bytes",
    ),
    Option(
        "appends_in_flight",
        int,
        1,
        "Appends in flight to one storage; produces arriving meanwhile wait and go together "
        "in the next one (more: lower latency for a few large producers, more calls); a lone "
        "single message may also take one more while no other lone message's call is in "
        "flight",
        unit="calls",
    ),
    Option(
        "broker_timeout_ms",
        int,
        3_000,
        "deadline of each call to a storage or dispatch service",
        unit="ms",
    ),
    Option(
        "namesrv_timeout_ms",
        int,
        3_000,
        "deadline of each call to a name server",
        unit="ms",
    ),
    Option(
        "topic_create_wait_ms",
        int,
        10_000,
        "CreateTopic and DeleteTopic wait this long for the name servers' route to show the change",
        unit="ms",
    ),
    # acl (issue 22; docs/security.md)
    Option(
        "auth_enabled",
        bool,
        False,
        "every call must be signed by a known user and allowed by its ACL "
        "(health and reflection stay open)",
    ),
    Option(
        "auth_max_skew_ms",
        int,
        900_000,
        "a signature's x-mq-date-time may differ this much from the gateway's clock "
        "(older: UNAUTHENTICATED, a replay window bound)",
        unit="ms",
    ),
    Option(
        "auth_refresh_interval_ms",
        int,
        2_000,
        "how often users and ACLs are fetched again from the storages (changes are "
        "effective within this)",
        unit="ms",
    ),
)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """The option values the gateway's parts use, in their units."""

    namesrv: tuple[str, ...]
    route_refresh_interval_s: float
    max_cached_topics: int
    auto_create_topics: bool
    default_queue_nums: int
    produce_retries: int
    max_produce_messages: int
    max_message_body_bytes: int
    max_produce_in_flight_bytes: int
    max_produce_stream_in_flight_bytes: int
    send_latency_fault: bool
    fault_isolation_ms: int
    max_held_pulls: int
    max_held_receives: int
    max_long_poll_ms: int
    long_poll_recheck_interval_s: float
    max_pull_bytes: int
    max_arrived_records_bytes: int
    max_pull_in_flight_bytes: int
    appends_in_flight: int
    broker_timeout_s: float
    namesrv_timeout_s: float
    topic_create_wait_s: float
    topic_message_type_check: bool = True
    auth_enabled: bool = False
    auth_max_skew_s: float = 900.0
    auth_refresh_interval_s: float = 2.0


def split_addresses(text: str) -> tuple[str, ...]:
    """``"a:1;b:2"`` -> ``("a:1", "b:2")``; blanks dropped."""
    return tuple(part.strip() for part in text.split(";") if part.strip())


def _address_error(flag: str, address: str) -> str | None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return f"{flag}: expected HOST:PORT, got {address!r}"
    return None


def check_config(config: Config) -> str | None:
    """What is wrong with the option values (None: nothing), checked before starting."""
    addresses = split_addresses(config.get_str("namesrv"))
    if not addresses:
        return "--namesrv: give at least one name server HOST:PORT (several separated by ';')"
    if len(addresses) > 64:
        return f"--namesrv: {len(addresses)} name servers; at most 64"
    for address in addresses:
        error = _address_error("--namesrv", address)
        if error:
            return error
    ranges = {
        "route_refresh_interval_ms": (100, 3_600_000),
        "max_cached_topics": (1, 10_000_000),
        "default_queue_nums": (1, MAX_QUEUE_NUMS),
        "produce_retries": (0, 16),
        "max_produce_messages": (1, PRODUCE_MESSAGES_MAX),
        "max_message_body_bytes": (1, MESSAGE_BODY_MAX_BYTES),
        "max_produce_in_flight_bytes": (MIB, MAX_IN_FLIGHT_LIMIT_BYTES),
        "max_produce_stream_in_flight_bytes": (MIB, MAX_IN_FLIGHT_LIMIT_BYTES),
        "fault_isolation_ms": (0, 3_600_000),
        "max_held_pulls": (0, 10_000_000),
        "max_held_receives": (0, 1_000_000),
        "max_long_poll_ms": (0, 3_600_000),
        "long_poll_recheck_interval_ms": (10, 600_000),
        "max_pull_bytes": (1, MESSAGE_BODY_MAX_BYTES),
        "max_arrived_records_bytes": (0, MAX_IN_FLIGHT_LIMIT_BYTES),
        "max_pull_in_flight_bytes": (MIB, MAX_IN_FLIGHT_LIMIT_BYTES),
        "appends_in_flight": (1, MAX_APPENDS_IN_FLIGHT),
        "broker_timeout_ms": (10, 600_000),
        "namesrv_timeout_ms": (10, 600_000),
        "topic_create_wait_ms": (0, 600_000),
        "auth_max_skew_ms": (1_000, 86_400_000),
        "auth_refresh_interval_ms": (100, 600_000),
    }
    return config.int_out_of_range(ranges)


def gateway_config(config: Config) -> GatewayConfig:
    return GatewayConfig(
        namesrv=split_addresses(config.get_str("namesrv")),
        route_refresh_interval_s=config.get_int("route_refresh_interval_ms") / 1000,
        max_cached_topics=config.get_int("max_cached_topics"),
        auto_create_topics=config.get_bool("auto_create_topics"),
        default_queue_nums=config.get_int("default_queue_nums"),
        produce_retries=config.get_int("produce_retries"),
        max_produce_messages=config.get_int("max_produce_messages"),
        max_message_body_bytes=config.get_int("max_message_body_bytes"),
        max_produce_in_flight_bytes=config.get_int("max_produce_in_flight_bytes"),
        max_produce_stream_in_flight_bytes=config.get_int("max_produce_stream_in_flight_bytes"),
        send_latency_fault=config.get_bool("send_latency_fault"),
        fault_isolation_ms=config.get_int("fault_isolation_ms"),
        max_held_pulls=config.get_int("max_held_pulls"),
        max_held_receives=config.get_int("max_held_receives"),
        max_long_poll_ms=config.get_int("max_long_poll_ms"),
        long_poll_recheck_interval_s=config.get_int("long_poll_recheck_interval_ms") / 1000,
        max_pull_bytes=config.get_int("max_pull_bytes"),
        max_arrived_records_bytes=config.get_int("max_arrived_records_bytes"),
        max_pull_in_flight_bytes=config.get_int("max_pull_in_flight_bytes"),
        appends_in_flight=config.get_int("appends_in_flight"),
        broker_timeout_s=config.get_int("broker_timeout_ms") / 1000,
        namesrv_timeout_s=config.get_int("namesrv_timeout_ms") / 1000,
        topic_create_wait_s=config.get_int("topic_create_wait_ms") / 1000,
        topic_message_type_check=config.get_bool("topic_message_type_check"),
        auth_enabled=config.get_bool("auth_enabled"),
        auth_max_skew_s=config.get_int("auth_max_skew_ms") / 1000,
        auth_refresh_interval_s=config.get_int("auth_refresh_interval_ms") / 1000,
    )
