"""Output of the gateway commands: aligned tables, JSON, message records, a progress bar."""

from __future__ import annotations

import base64
import datetime as dt
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from tide.client import ReceivedMessage

Cell = str | int | float | None
MAX_BODY_PREVIEW_CHARS = 60


def table(headers: Sequence[str], rows: Sequence[Sequence[Cell]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned, None shown as "-"."""
    shown = [[_cell(value) for value in row] for row in rows]
    numeric = [
        bool(rows) and all(isinstance(row[i], int | float) or row[i] is None for row in rows)
        for i in range(len(headers))
    ]
    widths = [
        max([len(header), *(len(row[i]) for row in shown)]) for i, header in enumerate(headers)
    ]

    def line(cells: Sequence[str]) -> str:
        parts = [
            cell.rjust(width) if right else cell.ljust(width)
            for cell, width, right in zip(cells, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(list(headers)), *(line(row) for row in shown)])


def _cell(value: Cell) -> str:
    if value is None:
        return "-"
    return str(value)


def dumps(document: Any) -> str:
    """One JSON document (or line): UTF-8 text kept, keys in the given order."""
    return json.dumps(document, ensure_ascii=False)


def utc_time(ms: int) -> str:
    """``2023-11-14T22:13:20.000Z`` for ms since epoch (empty for 0)."""
    if ms <= 0:
        return ""
    stamp = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def body_preview(body: bytes, limit: int = MAX_BODY_PREVIEW_CHARS) -> str:
    """The body as text when it is UTF-8 (else its size), cut at ``limit`` characters."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(body)} bytes>"
    text = text.replace("\n", "\\n").replace("\t", "\\t")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def message_json(message: ReceivedMessage) -> dict[str, Any]:
    """Every field of a received message, JSON-ready (body as base64, plus UTF-8 text when
    it is, as ``tide store dump`` prints it)."""
    try:
        body_utf8: str | None = message.body.decode("utf-8")
    except UnicodeDecodeError:
        body_utf8 = None
    return {
        "topic": message.topic,
        "broker_name": message.queue.broker_name,
        "queue_id": message.queue.queue_id,
        "queue_offset": message.queue_offset,
        "msg_id": message.msg_id,
        "unique_key": message.unique_key,
        "tags": message.tags,
        "keys": list(message.keys),
        "properties": dict(message.properties),
        "born_timestamp_ms": message.born_timestamp_ms,
        "store_timestamp_ms": message.store_timestamp_ms,
        "born_host": message.born_host,
        "store_host": message.store_host,
        "reconsume_times": message.reconsume_times,
        "physical_offset": message.physical_offset,
        "size_bytes": message.size_bytes,
        "body": base64.b64encode(message.body).decode("ascii"),
        "body_utf8": body_utf8,
    }


MESSAGE_HEADERS = ("BROKER", "QUEUE", "OFFSET", "MSG ID", "STORED (UTC)", "TAGS", "KEYS", "BODY")


def message_row(message: ReceivedMessage) -> list[Cell]:
    return [
        message.queue.broker_name,
        message.queue.queue_id,
        message.queue_offset,
        message.msg_id,
        utc_time(message.store_timestamp_ms),
        message.tags,
        " ".join(message.keys),
        body_preview(message.body),
    ]


class MessagePrinter:
    """Messages as JSON lines to ``json_out``, or else as table rows on stdout under one
    header (``tide consume``, plain and orderly)."""

    def __init__(self, json_out: TextIO | None) -> None:
        self.json_out = json_out
        self._header_printed = False

    def write(self, message: ReceivedMessage) -> None:
        if self.json_out is not None:
            self.json_out.write(dumps(message_json(message)) + "\n")
            return
        lines = table(MESSAGE_HEADERS, [message_row(message)]).splitlines()
        if not self._header_printed:
            print(lines[0])
            self._header_printed = True
        print(lines[1])

    def flush(self) -> None:
        (self.json_out or sys.stdout).flush()


class ProgressBar:
    """``[#####.....]  420/1000  42.0%  1234 msg/s`` on one line, redrawn at most 10 times a
    second; only when enabled (the caller passes ``stream.isatty()``)."""

    WIDTH = 30
    INTERVAL_S = 0.1

    def __init__(self, stream: TextIO, total: int, *, enabled: bool) -> None:
        self.stream = stream
        self.total = total
        self.enabled = enabled
        self.started = time.monotonic()
        self.drawn_at = 0.0
        self.drawn = False

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.drawn_at < self.INTERVAL_S and done < self.total:
            return
        self.drawn_at = now
        self.stream.write("\r" + self.render(done, now - self.started))
        self.stream.flush()
        self.drawn = True

    def render(self, done: int, elapsed_s: float) -> str:
        fraction = done / self.total if self.total > 0 else 1.0
        filled = int(fraction * self.WIDTH)
        rate = done / max(elapsed_s, 1e-6)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        return f"[{bar}] {done}/{self.total} {fraction * 100:5.1f}%  {rate:8.0f} msg/s"

    def finish(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
