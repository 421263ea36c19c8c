"""The denial audit is rate-limited per (user, method, resource) and second, with a
"denials suppressed" summary; the denial totals count every denial (services/gateway/
auth/audit.py)."""

from __future__ import annotations

import logging

import pytest

from services.gateway.auth.audit import (
    AUDIT_DENIALS_PER_KEY_PER_S,
    AUDIT_KEYS_MAX_COUNT,
    AUDIT_LOGGER,
    Audit,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _events(caplog: pytest.LogCaptureFixture, message: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == AUDIT_LOGGER and r.getMessage() == message]


def _deny(audit: Audit, who: str = "eve", resource: str = "Topic:orders") -> None:
    audit.denied("forbidden", who, "/tide.v1.Gateway/Produce", resource, "10.0.0.9:5", "no")


def test_a_flood_logs_a_bounded_number_of_events_and_one_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    clock = Clock()
    audit = Audit(clock)
    flood = 1_000
    for _ in range(flood):
        _deny(audit)
    _deny(audit, who="mallory")  # another key has its own budget
    assert audit.denials["forbidden"] == flood + 1
    assert len(_events(caplog, "denied")) == AUDIT_DENIALS_PER_KEY_PER_S + 1
    assert not _events(caplog, "denials suppressed")  # the second is not over

    clock.now += 1.0
    audit.sweep()  # the gateway's refresh loop, after the flood stopped
    (summary,) = _events(caplog, "denials suppressed")
    assert summary.suppressed == flood - AUDIT_DENIALS_PER_KEY_PER_S  # type: ignore[attr-defined]
    assert (summary.who, summary.resource) == ("eve", "Topic:orders")  # type: ignore[attr-defined]
    audit.sweep()
    assert len(_events(caplog, "denials suppressed")) == 1  # reported once

    _deny(audit)  # a new second: logged again
    assert len(_events(caplog, "denied")) == AUDIT_DENIALS_PER_KEY_PER_S + 2


def test_the_next_denial_after_the_window_reports_the_suppressed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    clock = Clock()
    audit = Audit(clock)
    for _ in range(AUDIT_DENIALS_PER_KEY_PER_S + 3):
        _deny(audit)
    clock.now += 1.5
    _deny(audit)
    (summary,) = _events(caplog, "denials suppressed")
    assert summary.suppressed == 3  # type: ignore[attr-defined]


def test_tracked_keys_are_bounded(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=AUDIT_LOGGER)
    audit = Audit(Clock())
    for _ in range(AUDIT_DENIALS_PER_KEY_PER_S + 2):
        _deny(audit, resource="Topic:first")
    for index in range(AUDIT_KEYS_MAX_COUNT):
        _deny(audit, resource=f"Topic:t{index}")
    assert len(audit._windows) == AUDIT_KEYS_MAX_COUNT
    (summary,) = _events(caplog, "denials suppressed")  # the evicted key's count kept
    assert summary.resource == "Topic:first"  # type: ignore[attr-defined]
    assert summary.suppressed == 2  # type: ignore[attr-defined]
