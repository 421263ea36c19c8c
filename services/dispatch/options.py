"""The dispatch service's options (flags, TIDE_DISPATCH_* environment, config file)."""

from __future__ import annotations

from pathlib import Path

from services.dispatch.delivery.timer import TimerOptions
from services.dispatch.delivery.timer_store import TimerSettings
from services.dispatch.engine.consume_queue import MAX_ENTRIES_PER_SEGMENT
from services.dispatch.engine.dispatch_store import DispatchConfig
from services.dispatch.pop.state import PopOptions
from services.dispatch.transaction.state import HALVES_MAX, TransactionOptions
from tide.format import (
    DEFAULT_DELAY_LEVELS,
    DEFAULT_INDEX_MAX_ENTRIES,
    DEFAULT_INDEX_SLOT_COUNT,
    DEFAULT_TIMER_MAX_DELAY_S,
    DEFAULT_TIMER_PRECISION_MS,
    DEFAULT_TIMER_ROLL_WINDOW_SLOTS,
    TIMER_BLANK_SLOTS,
    TIMER_WHEEL_SLOTS_TOTAL,
    DelayLevelError,
    IndexGeometry,
    TimerWheelGeometry,
    parse_delay_levels,
    timer_precision_ms,
    timer_roll_window_slots,
)
from tide.server import Config, Option

DEFAULT_LISTEN = "127.0.0.1:10921"
DEFAULT_STORAGE = "127.0.0.1:10911"
DEFAULT_TAIL_CACHE_BYTES = 64 << 20
MAX_TAIL_CACHE_BYTES = 4 << 30

OPTIONS: tuple[Option, ...] = (
    Option("listen", str, DEFAULT_LISTEN, "address to serve gRPC on (HOST:PORT; port 0 picks one)"),
    Option("store_dir", str, "./.tide/dispatch", "dispatch root: consumequeue/, index/, progress"),
    Option("storage", str, DEFAULT_STORAGE, "the storage service to follow (HOST:PORT)"),
    Option(
        "cq_entries_per_segment",
        int,
        300_000,
        "consume queue segment size (20 bytes an entry)",
        unit="entries",
    ),
    Option(
        "index_slot_count",
        int,
        DEFAULT_INDEX_SLOT_COUNT,
        "hash slots in one index file",
        unit="slots",
    ),
    Option(
        "index_max_entries",
        int,
        DEFAULT_INDEX_MAX_ENTRIES,
        "keys one index file holds before a new one is started",
        unit="entries",
    ),
    Option(
        "flush_interval_ms",
        int,
        1_000,
        "how often consume queues and index are flushed and the progress recorded",
        unit="ms",
    ),
    Option(
        "cleanup_interval_ms",
        int,
        10_000,
        "how often files only pointing below the storage's min offset are deleted",
        unit="ms",
    ),
    Option(
        "verify_body_crc",
        bool,
        False,
        "check every record's body CRC while dispatching (off, as RocketMQ's dispatch: "
        "the storage checks them in recovery, `tide store verify` offline); the record "
        "structure is always checked",
    ),
    Option(
        "tail_cache_bytes",
        int,
        DEFAULT_TAIL_CACHE_BYTES,
        "memory for the newest records followed, served with GetQueueEntries (records) so "
        "that a pull need not read them from the storage; 0 turns it off",
        unit="bytes",
    ),
    Option(
        "message_delay_level",
        str,
        DEFAULT_DELAY_LEVELS,
        "the delay level table (RocketMQ's messageDelayLevel): durations with a unit s, m, h "
        "or d, level 1 first; SCHEDULE_TOPIC_XXXX queue n-1 delivers level n",
    ),
    Option(
        "delivery_progress_interval_ms",
        int,
        1_000,
        "how often the delivery services record their progress (delayOffset.json) and "
        "copy it to the storage; also at stop",
        unit="ms",
    ),
    Option(
        "delivery_role_check_interval_ms",
        int,
        2_000,
        "how often the delivery services ask the storage whether it is a master (they "
        "deliver only then)",
        unit="ms",
    ),
    # -- transactions (docs/client.md, "Transactions") ---------------------------------
    Option(
        "transaction_check_interval_ms",
        int,
        60_000,
        "a half message unresolved this long since it was stored (or last checked) is "
        "checked with a live producer of its group (RocketMQ's transactionCheckInterval; "
        "at least 1000)",
        unit="ms",
    ),
    Option(
        "transaction_check_max",
        int,
        15,
        "checks of one half message; past them it is discarded (or kept: "
        "--transaction-keep-after-max) and logged (RocketMQ's transactionCheckMax)",
    ),
    Option(
        "transaction_keep_after_max",
        bool,
        False,
        "keep a half message unresolved past --transaction-check-max (no more checks) "
        "instead of discarding it",
    ),
    Option(
        "transaction_halves_max",
        int,
        HALVES_MAX,
        "unresolved half messages the transaction service holds (the oldest, checked "
        "first; later ones stay in the half queue and are read when older ones are "
        "resolved or discarded)",
    ),
    # -- POP consumption (docs/pop.md) --------------------------------------------------
    Option(
        "pop_revive_interval_ms",
        int,
        1_000,
        "how often received messages past their invisible time are delivered again "
        "(RocketMQ's revive scan)",
        unit="ms",
    ),
    Option(
        "pop_checkpoints_max",
        int,
        100_000,
        "received messages not yet acked the broker holds at most; past it a Receive is "
        "refused (RESOURCE_EXHAUSTED) until some are acked or delivered again",
        unit="checkpoints",
    ),
    Option(
        "pop_offset_flush_interval_ms",
        int,
        1_000,
        "how often POP groups' offsets and the revive progress are written to the storage",
        unit="ms",
    ),
    # -- the timer (docs/delivery.md, "Timed messages") --------------------------------
    Option(
        "timer_enable",
        bool,
        True,
        "run the timer: file the timer topic (rmq_sys_wheel_timer) into the timer log and "
        "wheel and deliver each timed message when due (RocketMQ's timerWheelEnable)",
    ),
    Option(
        "timer_precision_ms",
        int,
        DEFAULT_TIMER_PRECISION_MS,
        "timer wheel slot length: a timed message is delivered at or after its time and "
        "less than this after it; rounded down to 100, 200, 500 or 1000 "
        "(RocketMQ's timerPrecisionMs, 1000 there: Tide's 500 keeps the p99 lateness under "
        "1 s); keep it while timers are pending (the wheel numbers its slots in it)",
        unit="ms",
    ),
    Option(
        "timer_max_delay_ms",
        int,
        DEFAULT_TIMER_MAX_DELAY_S * 1000,
        "furthest ahead a timed message may be due; the gateway refuses one further with "
        "INVALID_ARGUMENT naming it (RocketMQ's timerMaxDelaySec)",
        unit="ms",
    ),
    Option(
        "timer_roll_window_slots",
        int,
        DEFAULT_TIMER_ROLL_WINDOW_SLOTS,
        "a timed message due this many slots or more ahead is filed at the window's end and "
        "filed again from there (RocketMQ's timerRollWindowSlot)",
        unit="slots",
    ),
)


def timer_options(config: Config) -> TimerOptions:
    """The timer's settings (the precision rounded as RocketMQ rounds it)."""
    geometry = TimerWheelGeometry(timer_precision_ms(config.get_int("timer_precision_ms")))
    return TimerOptions(
        settings=TimerSettings(
            geometry=geometry,
            roll_window_slots=timer_roll_window_slots(config.get_int("timer_roll_window_slots")),
        ),
        max_delay_ms=config.get_int("timer_max_delay_ms"),
        checkpoint_interval_ms=config.get_int("flush_interval_ms"),
    )


def dispatch_config(config: Config) -> DispatchConfig:
    return DispatchConfig(
        store_dir=Path(config.get_str("store_dir")),
        entries_per_segment=config.get_int("cq_entries_per_segment"),
        index_slot_count=config.get_int("index_slot_count"),
        index_max_entries=config.get_int("index_max_entries"),
        flush_interval_ms=config.get_int("flush_interval_ms"),
        delay_levels=parse_delay_levels(config.get_str("message_delay_level")),
    )


def transaction_options(config: Config) -> TransactionOptions:
    return TransactionOptions(
        check_interval_ms=config.get_int("transaction_check_interval_ms"),
        check_max=config.get_int("transaction_check_max"),
        keep_after_max=config.get_bool("transaction_keep_after_max"),
        halves_max=config.get_int("transaction_halves_max"),
    )


def pop_options(config: Config) -> PopOptions:
    return PopOptions(
        revive_interval_ms=config.get_int("pop_revive_interval_ms"),
        checkpoints_max=config.get_int("pop_checkpoints_max"),
        offset_flush_interval_ms=config.get_int("pop_offset_flush_interval_ms"),
    )


def check_config(config: Config) -> str | None:
    """What is wrong with the option values (None: nothing), checked before starting."""
    storage = config.get_str("storage")
    host, sep, port = storage.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return f"--storage: expected HOST:PORT, got {storage!r}"
    ranges = {
        "cq_entries_per_segment": (1, MAX_ENTRIES_PER_SEGMENT),
        "index_slot_count": (1, 2**31 - 1),
        "index_max_entries": (1, 2**31 - 1),
        "flush_interval_ms": (1, 3_600_000),
        "cleanup_interval_ms": (1, 86_400_000),
        "tail_cache_bytes": (0, MAX_TAIL_CACHE_BYTES),
        "delivery_progress_interval_ms": (1, 3_600_000),
        "delivery_role_check_interval_ms": (1, 3_600_000),
        "transaction_check_interval_ms": (1_000, 86_400_000),
        "transaction_check_max": (1, 1_000),
        "pop_revive_interval_ms": (10, 60_000),
        "pop_checkpoints_max": (1, 10_000_000),
        "pop_offset_flush_interval_ms": (10, 60_000),
        "transaction_halves_max": (1, 10 * HALVES_MAX),
        "timer_precision_ms": (1, 3_600_000),
        # Further than the roll window is filed again as it nears: a year is no limit of
        # the files, only of sense.
        "timer_max_delay_ms": (1, 365 * 86_400_000),
        "timer_roll_window_slots": (2, TIMER_WHEEL_SLOTS_TOTAL - TIMER_BLANK_SLOTS),
    }
    problem = config.int_out_of_range(ranges)
    if problem:
        return problem
    try:
        parse_delay_levels(config.get_str("message_delay_level"))
    except DelayLevelError as exc:
        return f"--message-delay-level: {exc}"
    try:
        IndexGeometry(config.get_int("index_slot_count"), config.get_int("index_max_entries"))
    except ValueError as exc:
        return f"--index-slot-count / --index-max-entries: {exc}"
    return None
