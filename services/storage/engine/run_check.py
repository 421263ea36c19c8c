"""A producer's record run, checked against the store before the append lock.

``tide.format.check_run`` checks the layout (sizes, magic, lengths, body CRC) and then
the store's own rules, in one call (compiled when the core runs): each topic is a valid
name that exists (or may be auto-created) and is writable (asked of the store once per
topic), each queue id is within the topic's write queues, the sys_flag sets only the
bits a producer may set. The whole run is checked before anything is written:
one bad record rejects it all. The store host is written under the lock, with the
store timestamp next to it (commitlog.py).

A store whose own host is IPv6 takes the general path: each record is decoded and
encoded again with the 20-byte store host (a run always carries an 8-byte slot).
"""

from __future__ import annotations

from collections.abc import Callable

from services.storage.engine.errors import InvalidMessageError
from services.storage.engine.message_codec import PRODUCER_SYSFLAG_MASK
from services.storage.engine.record_run import RecordRun, run_from_records
from tide.format import (
    BORN_HOST_POS,
    SYSFLAG_BORN_HOST_V6,
    SYSFLAG_STORE_HOST_V6,
    EncodedRecord,
    RecordError,
    RunLayout,
    check_run,
    decode_record,
    encode_record,
    properties_position,
    scan_run,
)
from tide.quoting import quote

# The sys_flag bits a run's record may carry: the producer's, and the born host's (the
# record's layout says which).
_RUN_SYSFLAG_MASK = PRODUCER_SYSFLAG_MASK | SYSFLAG_BORN_HOST_V6
# A topic's write queue count; None for a missing topic that may be created.
TopicLookup = Callable[[str], int | None]
Topics = dict[bytes, tuple[str, int]]  # UTF-8 name -> (name, write queue count)


class RunChecker:
    def __init__(
        self,
        store_host: bytes,
        max_body_bytes: int,
        max_records: int,
        topic_name: Callable[[bytes], str],
    ) -> None:
        """``store_host`` is packed (8 or 20 bytes); ``topic_name`` decodes and checks
        a topic's UTF-8 bytes (raising InvalidMessageError)."""
        assert len(store_host) in (8, 20), len(store_host)
        self._store_host = store_host
        self._max_body_bytes = max_body_bytes
        self._max_records = max_records
        self._topic_name = topic_name

    def check(
        self,
        data: bytearray,
        write_queue_count: TopicLookup,
        default_queue_count: int,
        cache: Topics | None = None,
    ) -> tuple[RecordRun, list[str]]:
        """The run ready for the lock, and the topics it would auto-create (the caller
        creates them once the run passed).

        One call checks the layout and the store's rules (``tide.format.check_run``,
        compiled when the core runs); the topic table is asked once per topic of the
        run, unless ``cache`` has the topic: it keeps the answers for topics that
        exist (the caller empties it whenever the topic table changes)."""
        missing: list[str] = []
        topics: Topics = {}

        def resolve(name: bytes, index: int) -> tuple[str, int]:
            found = cache.get(name) if cache is not None else None
            if found is None:
                found = self._topic(index, name, write_queue_count, default_queue_count, missing)
                if cache is not None and not missing:
                    cache[name] = found
            topics[name] = found
            return found

        try:
            checked = check_run(
                data, self._max_body_bytes, self._max_records, resolve, _RUN_SYSFLAG_MASK
            )
            if checked is None:
                layout = scan_run(data, self._max_body_bytes, self._max_records)
        except RecordError as exc:
            raise InvalidMessageError(f"records: {exc}") from None
        if checked is None:
            raise InvalidMessageError(_first_bad(layout, topics))
        sizes, keys, positions = checked
        if not sizes:
            raise InvalidMessageError("records is empty: send at least one record")
        if len(self._store_host) != 8:
            layout = scan_run(data, self._max_body_bytes, self._max_records)
            return self._with_v6_store_host(data, layout, topics), missing
        return RecordRun(data, sizes, keys, positions), missing

    def _topic(
        self,
        index: int,
        name: bytes,
        write_queue_count: TopicLookup,
        default_queue_count: int,
        missing: list[str],
    ) -> tuple[str, int]:
        """(name, write queue count) of the topic first named by record ``index``; a
        topic to create is noted in ``missing``."""
        try:
            topic = self._topic_name(name)
            count = write_queue_count(topic)
        except InvalidMessageError as exc:
            raise InvalidMessageError(f"records: record {index}: {exc}") from None
        if count is None:
            missing.append(topic)
            return topic, default_queue_count
        return topic, count

    def _with_v6_store_host(self, data: bytearray, layout: RunLayout, topics: Topics) -> RecordRun:
        records: list[EncodedRecord] = []
        for at, size, name, ts_pos in zip(
            layout.starts,
            layout.sizes,
            layout.topics,
            layout.store_timestamp_positions,
            strict=True,
        ):
            record = decode_record(data, at, at + size)
            records.append(
                encode_record(
                    topics[name][0],
                    name,
                    record.queue_id,
                    record.body,
                    bytes(data[properties_position(data, at) : at + size]),
                    record.flag,
                    record.sys_flag | SYSFLAG_STORE_HOST_V6,
                    record.born_timestamp_ms,
                    bytes(data[at + BORN_HOST_POS : at + ts_pos]),
                    self._store_host,
                    record.reconsume_times,
                    record.prepared_transaction_offset,
                )
            )
        return run_from_records(records)


def _first_bad(layout: RunLayout, topics: Topics) -> str:
    """What is wrong with the first record that breaks a rule (the slow path)."""
    for index, (name, queue_id, sys_flag) in enumerate(
        zip(layout.topics, layout.queue_ids, layout.sys_flags, strict=True)
    ):
        topic, count = topics[name]
        if sys_flag & ~_RUN_SYSFLAG_MASK:
            return (
                f"records: record {index}: sys_flag {sys_flag:#x} sets bits reserved for the "
                "store (host IPv6 bits)"
            )
        if not 0 <= queue_id < count:
            return (
                f"records: record {index}: queue_id {queue_id} is outside the {count} "
                f"write queues of topic {quote(topic)} (0..{count - 1})"
            )
    raise AssertionError("no record breaks a rule")
