"""``df.write.format("tide")`` and the streaming sink: batched produce per Spark task.

The streaming sink is **exactly-once** (_idempotent_sink.py: an idempotent producer per
query and partition, the micro-batch id its epoch), unless its option ``idempotent`` is
``false``. The batch write is **at-least-once**: a message is never reported written
unless the gateway said so, but a task that fails after some of its batches were stored
leaves those messages in the topic, and Spark's retry of the task sends them again.
Within a batch, only the messages the gateway answered SEND_FAILED for are sent
again, so a partial batch failure does not duplicate the rest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from tide.client import DEFAULT_GATEWAY, ClientTls, Message, Producer, SendResult, TideError
from tide.format import KEYS, TAGS, UNIQ_KEY
from tide.spark._idempotent_sink import pieces_of, stream_identity, write_exactly_once
from tide.spark._options import (
    CredentialsFile,
    OptionError,
    _lower,
    credentials_of,
    signing,
    tls_of,
    topics_of,
)

log = logging.getLogger("tide.spark")

# Messages per Produce call.
SEND_BATCH = 1000
# Attempts for the messages of a batch the gateway answered SEND_FAILED for.
SEND_ATTEMPTS = 3
COLUMNS = ("topic", "body", "keys", "tags", "properties", "sharding_key")
# Properties the gateway sets itself (from tags, keys, and a new unique key): dropped from
# the properties column, so rows read from a topic can be written back as they are.
RESERVED_PROPERTIES = frozenset((TAGS, KEYS, UNIQ_KEY))


class WriteError(TideError):
    """Messages that could not be written (the task fails; see the module doc)."""


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote, per topic."""

    written: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class WriteOptions:
    gateway: str
    topic: str | None
    batch: int
    # The streaming sink through idempotent producers (exactly-once); option idempotent.
    idempotent: bool = True
    tls: ClientTls = False
    credentials: CredentialsFile | None = None

    @classmethod
    def parse(cls, raw: Mapping[str, str], schema: StructType) -> WriteOptions:
        options = _lower(raw)
        topics = topics_of(options, required=False)
        if len(topics) > 1:
            raise OptionError("writing: option topic names one topic")
        names = set(schema.fieldNames())
        if "body" not in names:
            raise OptionError("writing needs a column body (binary or string)")
        if not topics and "topic" not in names:
            raise OptionError("writing needs a column topic or the option topic")
        batch = int(options.get("batchsize", SEND_BATCH))
        if not 1 <= batch <= SEND_BATCH:
            raise OptionError(f"option batchSize is {batch}; give 1..{SEND_BATCH}")
        idempotent = options.get("idempotent", "true").lower()
        if idempotent not in ("true", "false"):
            raise OptionError(f"option idempotent is {idempotent!r}; give true or false")
        return cls(
            options.get("gateway", DEFAULT_GATEWAY),
            topics[0] if topics else None,
            batch,
            idempotent == "true",
            tls_of(options),
            credentials_of(options),
        )


def messages_of(batch: pa.RecordBatch, topic: str | None) -> list[Message]:
    """The rows of ``batch`` as messages (option ``topic`` wins over a topic column)."""
    names = set(batch.schema.names)
    columns = {name: batch.column(name).to_pylist() for name in COLUMNS if name in names}
    rows = batch.num_rows
    none: list[None] = [None] * rows
    topics = [topic] * rows if topic else columns["topic"]
    bodies, keys = columns["body"], columns.get("keys", none)
    tags, props = columns.get("tags", none), columns.get("properties", none)
    sharding = columns.get("sharding_key", none)
    messages = []
    for i in range(rows):
        if topics[i] is None or bodies[i] is None:
            what = "body" if topics[i] else "topic"
            raise WriteError(f"row {i} of a batch has a null {what}")
        properties = props[i]
        messages.append(
            Message(
                topics[i],
                bodies[i],
                tags=tags[i] or "",
                keys=keys[i] or (),
                # Arrow gives a map as a list of (key, value) pairs.
                properties={k: v for k, v in properties or () if k not in RESERVED_PROPERTIES},
                sharding_key=sharding[i] or None,
            )
        )
    return messages


def send_all(producer: Producer, messages: Sequence[Message], report: WriteReport) -> None:
    """Send ``messages``; retry only the ones answered SEND_FAILED; raise if any is left."""
    pending = list(messages)
    for attempt in range(1, SEND_ATTEMPTS + 1):
        results: list[SendResult] = producer.send_batch(pending)
        failed = []
        for message, result in zip(pending, results, strict=True):
            if result.written:
                report.written[message.topic] = report.written.get(message.topic, 0) + 1
            else:
                failed.append((message, result.error))
        if not failed:
            return
        if attempt == SEND_ATTEMPTS:
            raise WriteError(
                f"{len(failed)} of {len(messages)} messages not written after "
                f"{SEND_ATTEMPTS} attempts: {failed[0][1]}"
            )
        log.warning("%d messages not written; sending them again", len(failed))
        pending = [message for message, _ in failed]
        time.sleep(0.1 * attempt)


def write_batches(options: WriteOptions, batches: Iterator[pa.RecordBatch]) -> WriteReport:
    report = WriteReport()
    credentials = signing(options.credentials)
    with Producer(options.gateway, tls=options.tls, credentials=credentials) as producer:
        for batch in batches:
            for start in range(0, batch.num_rows, options.batch):
                piece = batch.slice(start, options.batch)
                send_all(producer, messages_of(piece, options.topic), report)
    return report


def _summary(messages: Sequence[WriterCommitMessage | None]) -> tuple[dict[str, int], int]:
    totals: dict[str, int] = {}
    failed = 0
    for message in messages:
        if isinstance(message, WriteReport):
            for topic, count in message.written.items():
                totals[topic] = totals.get(topic, 0) + count
        else:
            failed += 1
    return totals, failed


class TideWriter(DataSourceArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return write_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        totals, _ = _summary(messages)
        log.info("tide write committed: %s", totals)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # Stored messages cannot be taken back: say what is in the topics.
        totals, failed = _summary(messages)
        log.warning(
            "tide write aborted: %d task(s) failed; tasks that finished wrote %s "
            "(at-least-once: these stay in the topics)",
            failed,
            totals,
        )


class TideStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        options = self.options
        identity = stream_identity() if options.idempotent else None
        if identity is None:
            if options.idempotent:
                log.warning("no streaming query id or batch id: writing at-least-once")
            return write_batches(options, iterator)
        report = WriteReport()
        pieces = pieces_of(iterator, options.batch, options.topic)
        write_exactly_once(
            options.gateway,
            identity,
            pieces,
            report.written,
            options.tls,
            signing(options.credentials),
        )
        return report

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        totals, _ = _summary(messages)
        log.info("tide sink committed batch %d: %s", batchId, totals)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        totals, failed = _summary(messages)
        log.warning(
            "tide sink aborted batch %d: %d task(s) failed; finished tasks wrote %s "
            "(sent again when the batch is retried: exactly-once unless option "
            "idempotent is false)",
            batchId,
            failed,
            totals,
        )
