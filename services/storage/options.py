"""The storage service's options (flags, TIDE_STORAGE_* environment, config file)."""

from __future__ import annotations

from pathlib import Path

from services.storage.engine.config import GIB, MIB, FlushMode, StoreConfig
from services.storage.engine.queue_locks import (
    DEFAULT_MAX_LIVE_MS,
    MAX_MAX_LIVE_MS,
    MIN_MAX_LIVE_MS,
)
from services.storage.registration import MAX_NAME_SERVERS, parse_name_servers
from services.storage.replication.settings import (
    DEFAULT_SYNC_INTERVAL_MS,
    MAX_SYNC_INTERVAL_MS,
    MIN_SYNC_INTERVAL_MS,
    BrokerRole,
    ReplicationSettings,
)
from tide.limits import MESSAGE_BODY_MAX_BYTES, PRODUCE_MESSAGES_MAX, QUEUE_NUMS_MAX
from tide.registration import (
    MAX_HEARTBEAT_TIMEOUT_MS,
    address_error,
    broker_id_error,
    name_error,
)
from tide.server import Config, Option
from tide.tail.follower import MAX_CHUNK_BYTES

DEFAULT_LISTEN = "127.0.0.1:10911"
DEFAULT_TAIL_CHUNK_BYTES = 256 * 1024
MAX_TAIL_CHUNK_BYTES = MAX_CHUNK_BYTES  # one limit: what a Tail follower may ask for
DEFAULT_APPEND_IN_FLIGHT_BYTES = 256 * MIB
MAX_IN_FLIGHT_LIMIT_BYTES = 64 * 1024 * MIB

OPTIONS: tuple[Option, ...] = (
    Option("listen", str, DEFAULT_LISTEN, "address to serve gRPC on (HOST:PORT; port 0 picks one)"),
    Option("store_dir", str, "./.tide/store", "store root: commitlog/, config/, checkpoint"),
    Option(
        "advertise",
        str,
        None,
        "HOST:PORT in message ids and the store_host field "
        "(default: the listen address, 127.0.0.1 for a wildcard host)",
    ),
    Option(
        "flush",
        str,
        "async",
        "flush policy: sync = group commit before answering, async = flush thread on an interval",
        choices=("sync", "async"),
    ),
    Option("segment_size_bytes", int, GIB, "commitlog segment size", unit="bytes"),
    Option("flush_interval_ms", int, 500, "async flush interval", unit="ms"),
    Option(
        "flush_least_pages",
        int,
        4,
        "async flush only with at least this many dirty pages",
        unit="pages",
    ),
    Option(
        "flush_thorough_interval_ms",
        int,
        10_000,
        "async flush of every dirty page this often",
        unit="ms",
    ),
    Option(
        "sync_flush_timeout_ms", int, 5_000, "sync flush wait before FLUSH_DISK_TIMEOUT", unit="ms"
    ),
    Option(
        "write_buffer_pool",
        bool,
        False,
        "append into pooled memory and commit to the file "
        "on a thread (RocketMQ's transientStorePoolEnable)",
    ),
    Option(
        "write_buffer_pool_buffers",
        int,
        5,
        "buffers in the write buffer pool, each one segment big",
        unit="buffers",
    ),
    Option("commit_interval_ms", int, 200, "write buffer commit interval", unit="ms"),
    Option("preallocate", bool, True, "reserve segment blocks with posix_fallocate"),
    Option(
        "warm_segments",
        bool,
        True,
        "fault in every page of a new segment in the background (MADV_POPULATE_WRITE), "
        "then try mlock + madvise(WILLNEED); keeps page faults off the append path",
    ),
    Option(
        "max_message_body_bytes",
        int,
        4 * MIB,
        "largest message body accepted (at most 33554432: MESSAGE_BODY_MAX_BYTES)",
        unit="bytes",
    ),
    Option("max_batch_messages", int, 10_000, "most messages in one Append", unit="messages"),
    Option(
        "max_append_in_flight_bytes",
        int,
        DEFAULT_APPEND_IN_FLIGHT_BYTES,
        "bytes of the Append requests (Append calls and AppendStream requests) held at once, "
        "e.g. waiting for a sync flush or a slave (a request of `records` counts its records' "
        "bytes, one of `messages` its serialized size); an Append past it gets "
        "RESOURCE_EXHAUSTED and writes nothing",
        unit="bytes",
    ),
    Option("auto_create_topics", bool, True, "create unknown topics on first append"),
    Option("default_queue_nums", int, 4, "queues of an auto-created topic", unit="queues"),
    Option("retention_hours", float, 72.0, "delete segments older than this", unit="hours"),
    Option(
        "cleanup_hour", int, 4, "hour of day (local time) for the daily deletion pass", unit="hour"
    ),
    Option("cleanup_interval_ms", int, 10_000, "how often disk usage is checked", unit="ms"),
    Option(
        "disk_clean_ratio",
        float,
        0.75,
        "delete expired segments at once above this disk usage (with the next segment)",
        unit="ratio",
    ),
    Option(
        "disk_clean_force_ratio",
        float,
        0.85,
        "delete the oldest segments regardless of age above this disk usage (with the next "
        "segment)",
        unit="ratio",
    ),
    Option(
        "disk_refuse_writes_ratio",
        float,
        0.90,
        "refuse appends (RESOURCE_EXHAUSTED) above this disk usage (with the next segment)",
        unit="ratio",
    ),
    Option(
        "tail_max_chunk_bytes",
        int,
        DEFAULT_TAIL_CHUNK_BYTES,
        "default Tail chunk size (at most 4194304: MAX_CHUNK_BYTES)",
        unit="bytes",
    ),
    Option(
        "held_segment_force_delete_ms",
        int,
        120_000,
        "delete an expired segment a reader still holds after this long",
        unit="ms",
    ),
    Option(
        "consumer_offsets_persist_interval_ms",
        int,
        5_000,
        "write committed consumer offsets at most this often (a crash loses at most this much)",
        unit="ms",
    ),
    Option(
        "producer_window_batches",
        int,
        5,
        "idempotent producers: batches remembered per producer and queue (1..1000); a retry "
        "of an older one is refused",
    ),
    Option(
        "producer_id_expiry_ms",
        int,
        86_400_000,
        "idempotent producers: forget a producer id idle this long (1 s .. 30 days); "
        "recovery without a recent snapshot replays only this much commitlog",
        unit="ms",
    ),
    Option(
        "max_idempotent_producers",
        int,
        10_000,
        "idempotent producers: ids remembered at most (1..1000000); past it a new id is "
        "refused with RESOURCE_EXHAUSTED",
    ),
    Option(
        "producer_state_snapshot_interval_ms",
        int,
        10_000,
        "idempotent producers: write config/producerState.json this often when a "
        "producer changed (recovery replays the commitlog after it)",
        unit="ms",
    ),
    Option("cluster_name", str, "DefaultCluster", "cluster this broker belongs to"),
    Option(
        "broker_name",
        str,
        "broker-a",
        "broker name; a master (broker id 0) and its slaves share it",
    ),
    Option("broker_id", int, 0, "0 for the master, > 0 for a slave"),
    Option(
        "namesrv",
        str,
        None,
        "name servers to register with, HOST:PORT separated by ';' "
        "(RocketMQ's namesrvAddr); empty: do not register",
    ),
    Option(
        "dispatch_address",
        str,
        None,
        "HOST:PORT of the dispatch service following this storage, as clients reach it; "
        "sent in the registration",
    ),
    Option(
        "register_interval_ms",
        int,
        30_000,
        "register with every name server this often (and at once on topic changes)",
        unit="ms",
    ),
    Option(
        "register_timeout_ms",
        int,
        5_000,
        "timeout of one registration (or unregistration) call to one name server",
        unit="ms",
    ),
    Option(
        "broker_heartbeat_timeout_ms",
        int,
        120_000,
        "how long name servers keep this broker without a registration",
        unit="ms",
    ),
    Option(
        "consumer_expiry_ms",
        int,
        120_000,
        "drop a consumer group member without a heartbeat for this long",
        unit="ms",
    ),
    Option(
        "rebalance_lock_max_live_time_ms",
        int,
        DEFAULT_MAX_LIVE_MS,
        "an orderly consumer's queue lock expires this long after its holder's last lock "
        "request (RocketMQ's rebalanceLockMaxLiveTime); nothing is granted for this long "
        f"after a start; {MIN_MAX_LIVE_MS}..{MAX_MAX_LIVE_MS}",
        unit="ms",
    ),
    Option(
        "role",
        str,
        "ASYNC_MASTER",
        "broker role: ASYNC_MASTER answers appends at once, SYNC_MASTER after a slave "
        "acknowledged them, SLAVE copies --master's commitlog and refuses appends",
        choices=("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"),
    ),
    Option("master", str, None, "a slave's master storage (HOST:PORT)"),
    Option(
        "ha_batch_bytes",
        int,
        32 * 1024,
        "most commitlog bytes in one replication chunk (RocketMQ's haTransferBatchSize)",
        unit="bytes",
    ),
    Option(
        "ha_heartbeat_interval_ms",
        int,
        5_000,
        "a slave acks at least this often and a master sends a heartbeat when idle this long; "
        "a stream silent for 4 intervals is dropped",
        unit="ms",
    ),
    Option(
        "ha_max_gap_bytes",
        int,
        256 * MIB,
        "a slave further behind than this is not in sync: SYNC_MASTER appends get "
        "SLAVE_NOT_AVAILABLE (RocketMQ's haMaxGapNotInSync)",
        unit="bytes",
    ),
    Option(
        "sync_slave_timeout_ms",
        int,
        5_000,
        "SYNC_MASTER wait for a slave's ack before FLUSH_SLAVE_TIMEOUT",
        unit="ms",
    ),
    Option(
        "metadata_sync_interval_ms",
        int,
        DEFAULT_SYNC_INTERVAL_MS,
        "a slave copies its master's metadata files (topics, consumer offsets, group configs, "
        f"delivery progress) this often (RocketMQ's SlaveSynchronize); "
        f"{MIN_SYNC_INTERVAL_MS}..{MAX_SYNC_INTERVAL_MS}",
        unit="ms",
    ),
    # acl (issue 22; docs/security.md)
    Option(
        "auth_init_user_file",
        str,
        None,
        'a JSON file {"username": ..., "password": ...}: created as a super user when this '
        "master has no users yet (the first admin; tide up --auth writes one)",
    ),
)

MAX_HA_BATCH_BYTES = 4 * MIB


def check_config(config: Config) -> str | None:
    """What is wrong with the broker and membership options (None: nothing), checked
    before starting."""
    checks = (
        name_error("--cluster-name", config.get_str("cluster_name")),
        name_error("--broker-name", config.get_str("broker_name")),
        broker_id_error(config.get_int("broker_id")),
    )
    problem = next((check for check in checks if check is not None), None)
    if problem is not None:
        return problem.replace("broker_id", "--broker-id")
    name_servers = parse_name_servers(config.get_optional_str("namesrv") or "")
    if len(name_servers) > MAX_NAME_SERVERS:
        return f"--namesrv: {len(name_servers)} addresses; at most {MAX_NAME_SERVERS}"
    if len(set(name_servers)) != len(name_servers):
        return f"--namesrv: an address is listed twice in {';'.join(name_servers)!r}"
    for address in name_servers:
        problem = address_error("--namesrv", address)
        if problem is not None:
            return f"{problem} (separate several with ';')"
    dispatch_address = config.get_optional_str("dispatch_address")
    if dispatch_address:
        problem = address_error("--dispatch-address", dispatch_address)
        if problem is not None:
            return problem
    problem = _replication_problem(config)
    if problem is not None:
        return problem
    ranges = {
        "max_message_body_bytes": (1, MESSAGE_BODY_MAX_BYTES),
        "tail_max_chunk_bytes": (1, MAX_TAIL_CHUNK_BYTES),
        # The gateway's --max-produce-messages has the same ceiling: kept at or below
        # the storages' (docs), it always can be.
        "max_batch_messages": (1, PRODUCE_MESSAGES_MAX),
        # An auto-created topic the name servers would refuse to register otherwise.
        "default_queue_nums": (1, QUEUE_NUMS_MAX),
        "max_append_in_flight_bytes": (MIB, MAX_IN_FLIGHT_LIMIT_BYTES),
        "ha_batch_bytes": (1024, MAX_HA_BATCH_BYTES),
        "ha_heartbeat_interval_ms": (100, 60_000),
        "ha_max_gap_bytes": (1, 1 << 50),
        "sync_slave_timeout_ms": (1, 600_000),
        "metadata_sync_interval_ms": (MIN_SYNC_INTERVAL_MS, MAX_SYNC_INTERVAL_MS),
        "register_interval_ms": (1, 3_600_000),
        "register_timeout_ms": (1, 600_000),
        "broker_heartbeat_timeout_ms": (1, MAX_HEARTBEAT_TIMEOUT_MS),
        "consumer_expiry_ms": (1, MAX_HEARTBEAT_TIMEOUT_MS),
        "rebalance_lock_max_live_time_ms": (MIN_MAX_LIVE_MS, MAX_MAX_LIVE_MS),
    }
    for name, (low, high) in ranges.items():
        value = config.get_int(name)
        if not low <= value <= high:
            return f"--{name.replace('_', '-')}: {value} is outside {low}..{high}"
    return None


def _replication_problem(config: Config) -> str | None:
    """A slave names its master and has an id > 0; a master has id 0 and no --master."""
    role = BrokerRole(config.get_str("role"))
    broker_id = config.get_int("broker_id")
    master = config.get_optional_str("master") or ""
    if role is BrokerRole.SLAVE:
        if not master:
            return "--role SLAVE needs --master HOST:PORT (the master storage's address)"
        problem = address_error("--master", master)
        if problem is not None:
            return problem
        if broker_id <= 0:
            return f"--role SLAVE needs --broker-id > 0 (got {broker_id}); 0 is the master"
        if config.get_bool("write_buffer_pool"):
            return "--role SLAVE cannot use --write-buffer-pool; drop it on the slave"
        return None
    if master:
        return f"--master is for a slave; start with --role SLAVE or drop --master ({role.value})"
    if broker_id != 0:
        return f"--role {role.value} needs --broker-id 0 (got {broker_id}); slaves have ids > 0"
    return None


def replication_settings(config: Config) -> ReplicationSettings:
    return ReplicationSettings(
        role=BrokerRole(config.get_str("role")),
        broker_name=config.get_str("broker_name"),
        broker_id=config.get_int("broker_id"),
        master_address=config.get_optional_str("master") or "",
        batch_bytes=config.get_int("ha_batch_bytes"),
        heartbeat_interval_ms=config.get_int("ha_heartbeat_interval_ms"),
        max_gap_bytes=config.get_int("ha_max_gap_bytes"),
        sync_slave_timeout_ms=config.get_int("sync_slave_timeout_ms"),
        metadata_sync_interval_ms=config.get_int("metadata_sync_interval_ms"),
    )


def advertised_host(config: Config, endpoint: str) -> str:
    """``--advertise``, else the bound endpoint (127.0.0.1 for a wildcard host)."""
    advertise = config.get_optional_str("advertise")
    if advertise:
        return advertise
    host, _, port = endpoint.rpartition(":")
    if host in ("", "0.0.0.0", "[::]"):
        host = "127.0.0.1"
    return f"{host}:{port}"


def store_config(config: Config, store_host: str) -> StoreConfig:
    return StoreConfig(
        store_dir=Path(config.get_str("store_dir")),
        segment_size_bytes=config.get_int("segment_size_bytes"),
        flush_mode=FlushMode(config.get_str("flush")),
        flush_interval_ms=config.get_int("flush_interval_ms"),
        flush_least_pages=config.get_int("flush_least_pages"),
        flush_thorough_interval_ms=config.get_int("flush_thorough_interval_ms"),
        sync_flush_timeout_ms=config.get_int("sync_flush_timeout_ms"),
        write_buffer_pool_enabled=config.get_bool("write_buffer_pool"),
        write_buffer_pool_buffers=config.get_int("write_buffer_pool_buffers"),
        commit_interval_ms=config.get_int("commit_interval_ms"),
        preallocate_enabled=config.get_bool("preallocate"),
        warm_segments_enabled=config.get_bool("warm_segments"),
        max_message_body_bytes=config.get_int("max_message_body_bytes"),
        max_batch_messages=config.get_int("max_batch_messages"),
        auto_create_topics=config.get_bool("auto_create_topics"),
        default_queue_nums=config.get_int("default_queue_nums"),
        store_host=store_host,
        retention_hours=config.get_float("retention_hours"),
        cleanup_hour=config.get_int("cleanup_hour"),
        cleanup_interval_ms=config.get_int("cleanup_interval_ms"),
        disk_clean_ratio=config.get_float("disk_clean_ratio"),
        disk_clean_force_ratio=config.get_float("disk_clean_force_ratio"),
        disk_refuse_writes_ratio=config.get_float("disk_refuse_writes_ratio"),
        held_segment_force_delete_ms=config.get_int("held_segment_force_delete_ms"),
        consumer_offsets_persist_interval_ms=config.get_int("consumer_offsets_persist_interval_ms"),
        producer_window_batches=config.get_int("producer_window_batches"),
        producer_id_expiry_ms=config.get_int("producer_id_expiry_ms"),
        max_idempotent_producers=config.get_int("max_idempotent_producers"),
        producer_state_snapshot_interval_ms=config.get_int("producer_state_snapshot_interval_ms"),
    )
