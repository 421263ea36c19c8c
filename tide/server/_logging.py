"""Structured logging on stderr, as text or JSON lines.

Text:  ``2026-11-22T03:47:09.123Z INFO storage tide.storage.flush: flushed bytes=4096``
JSON:  ``{"ts": "...", "level": "INFO", "service": "storage", "logger": "...", "msg": "...",
"bytes": 4096}``

Fields passed with ``logger.info("...", extra={"bytes": 4096})`` become ``key=value`` pairs
(text) or object members (JSON). A line logged while a recording span is current (e.g.
inside a traced call) carries ``trace_id`` and ``span_id`` (lowercase hex, as in
``traceparent``), so logs and traces join.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from opentelemetry import trace

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_STANDARD_ATTRS = frozenset(
    frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None)))
    | {"message", "asctime", "taskName"}
)
_RESERVED_KEYS = frozenset({"ts", "level", "service", "logger", "msg", "exc"})


class _TideHandler(logging.StreamHandler[TextIO]):
    """Marks the handler configure_logging installed, so a second call replaces it."""


def configure_logging(level: str, fmt: str, service: str) -> None:
    """Send all logging to stderr at ``level`` (debug/info/warning/error) as ``fmt``
    (text/json). Calling it again replaces the previous set-up."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    formatters: dict[str, logging.Formatter] = {
        "text": TextFormatter(service),
        "json": JsonFormatter(service),
    }
    if fmt not in formatters:
        raise ValueError(f"log format must be text or json, got {fmt!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _TideHandler)]:
        root.removeHandler(old)
    handler = _TideHandler(sys.stderr)
    handler.setFormatter(formatters[fmt])
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    logging.captureWarnings(True)


def format_timestamp(created: float) -> str:
    """``2026-11-22T03:47:09.123Z`` (UTC, milliseconds)."""
    moment = datetime.fromtimestamp(created, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def extra_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra={...}`` fields of a record, in the order they were given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


def trace_fields() -> dict[str, str]:
    """``trace_id`` / ``span_id`` of the current span when it is recording (else empty).
    Formatters run in the thread (and context) that logged, so this is the caller's span."""
    span = trace.get_current_span()
    if not span.is_recording():
        return {}
    ctx = span.get_span_context()
    return {"trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}"}


class TextFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"{format_timestamp(record.created)} {record.levelname} {self._service} "
            f"{record.name}: {record.getMessage()}"
        )
        fields = {**extra_fields(record), **trace_fields()}
        pairs = " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        if pairs:
            line += " " + pairs
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": format_timestamp(record.created),
            "level": record.levelname,
            "service": self._service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in extra_fields(record).items():
            entry[f"extra_{key}" if key in _RESERVED_KEYS else key] = value
        entry.update(trace_fields())
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def _text_value(value: object) -> str:
    text = value if isinstance(value, str) else str(value)
    if text == "" or any(c.isspace() or c in '="' for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text
