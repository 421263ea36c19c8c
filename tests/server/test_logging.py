"""Text and JSON log lines."""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator

import pytest

from tide.server import configure_logging
from tide.server._logging import JsonFormatter, TextFormatter, format_timestamp

TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def make_record(msg: str, extra: dict[str, object], exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad segment")
        except ValueError:
            exc_info = sys.exc_info()
    logger = logging.getLogger("tide.storage.flush")
    return logger.makeRecord(logger.name, logging.INFO, __file__, 1, msg, (), exc_info, extra=extra)


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_timestamp_is_utc_with_milliseconds() -> None:
    assert format_timestamp(1_795_319_229.1239) == "2026-11-22T03:47:09.123Z"


def test_text_line_has_fields_in_order() -> None:
    record = make_record("flushed %d bytes", {"bytes": 4096, "file": "a b", "empty": ""})
    record.args = (4096,)
    line = TextFormatter("storage").format(record)
    fields = 'bytes=4096 file="a b" empty=""'
    pattern = rf"^{TS} INFO storage tide.storage.flush: flushed 4096 bytes {fields}$"
    assert re.match(pattern, line), line


def test_text_line_includes_the_traceback() -> None:
    line = TextFormatter("storage").format(make_record("flush failed", {}, exc=True))
    assert "flush failed\nTraceback (most recent call last):" in line
    assert line.endswith("ValueError: bad segment")


def test_json_line_is_one_object_with_extra_fields() -> None:
    record = make_record("flushed", {"bytes": 4096, "service": "clash", "path": object()}, exc=True)
    line = JsonFormatter("storage").format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert re.fullmatch(TS, entry["ts"])
    assert entry["level"] == "INFO"
    assert entry["service"] == "storage"
    assert entry["logger"] == "tide.storage.flush"
    assert entry["msg"] == "flushed"
    assert entry["bytes"] == 4096
    assert entry["extra_service"] == "clash"
    assert entry["path"].startswith("<object object")
    assert "ValueError: bad segment" in entry["exc"]


@pytest.mark.usefixtures("restore_root_logger")
def test_configure_logging_writes_json_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("warning", "json", "storage")
    configure_logging("warning", "json", "storage")  # replaces, does not duplicate
    log = logging.getLogger("tide.test")
    log.info("hidden")
    log.warning("shown", extra={"topic": "orders"})
    lines = capsys.readouterr().err.splitlines()
    entries = [json.loads(line) for line in lines if line.startswith("{")]
    assert [(e["msg"], e["topic"]) for e in entries] == [("shown", "orders")]


def test_configure_logging_rejects_unknown_values() -> None:
    with pytest.raises(ValueError, match="log level"):
        configure_logging("verbose", "text", "storage")
    with pytest.raises(ValueError, match="log format"):
        configure_logging("info", "xml", "storage")
