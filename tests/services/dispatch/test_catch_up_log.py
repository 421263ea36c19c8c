"""The catch-up progress line while dispatch is far behind (a rebuild)."""

from __future__ import annotations

import logging

import pytest

from services.dispatch import dispatcher
from services.dispatch.dispatcher import _CatchUpLog


def test_logs_progress_only_when_far_behind_and_at_most_every_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr("services.dispatch.dispatcher.time.monotonic", lambda: clock[0])
    progress = _CatchUpLog(start_offset=0)
    behind = dispatcher.CATCH_UP_LOG_MIN_LAG_BYTES
    with caplog.at_level(logging.INFO, logger="tide.dispatch"):
        clock[0] += 1
        progress.update(10, 10 + 2 * behind)  # too soon after the start
        clock[0] += dispatcher.CATCH_UP_LOG_INTERVAL_S
        progress.update(1000, 1000 + behind // 2)  # close enough: no line
        progress.update(1000, 1000 + 2 * behind)
        clock[0] += 1
        progress.update(2000, 2000 + 2 * behind)  # within the interval: no line
    lines = [r.getMessage() for r in caplog.records if "catching up" in r.getMessage()]
    assert len(lines) == 1
    assert f"dispatched 1000 of {1000 + 2 * behind} bytes" in lines[0]
