"""Audit events (issue 22): every refused request and every user/ACL change, as one
structured line on the ``tide.audit`` logger (who, what, resource, source address,
decision), and the denial totals behind ``tide_gateway_auth_denials_total{reason}``.

An event names the access key, never a secret key or a signature.

Denial events are rate-limited so that a flood of refused calls cannot flood the log: at
most ``AUDIT_DENIALS_PER_KEY_PER_S`` events per (user, method, resource) and second;
the rest of that second are counted and reported by one ``denials suppressed`` event
(``suppressed=N``) once the second is over (at the next denial, or at the gateway's
next auth refresh: :meth:`Audit.sweep`). The metric counts every denial.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from opentelemetry.metrics import CallbackOptions, Observation

from tide.server import service_meter

AUDIT_LOGGER = "tide.audit"
_log = logging.getLogger(AUDIT_LOGGER)
# The reasons a denial is counted under (bounded: the metric's label values).
REASONS = ("unauthenticated", "forbidden", "unknown_method")
# Denial events logged per (user, method, resource) and one-second window; the rest of
# the window is summarised in one "denials suppressed" event.
AUDIT_DENIALS_PER_KEY_PER_S = 10
# Keys whose window is tracked at once (the least recently denied go first, their
# suppressed count reported): bounds the memory a flood of distinct names can take.
AUDIT_KEYS_MAX_COUNT = 10_000
WINDOW_S = 1.0

Key = tuple[str, str, str]  # (who, method, resource)


@dataclass(slots=True)
class _Window:
    start: float
    logged: int = 0
    suppressed: int = 0
    reason: str = ""
    source: str = ""


class Audit:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.denials: Counter[str] = Counter()
        self._clock = clock
        self._windows: OrderedDict[Key, _Window] = OrderedDict()
        self._next_sweep = 0.0

    def denied(
        self, reason: str, who: str, method: str, resource: str, source: str, detail: str
    ) -> None:
        self.denials[reason] += 1  # every denial, logged or not
        now = self._clock()
        if now >= self._next_sweep:
            self.sweep()
        key = (who, method, resource)
        window = self._windows.get(key)
        if window is not None and now - window.start >= WINDOW_S:
            self._report(key, window)
            window = None
        if window is None:
            window = self._windows[key] = _Window(now)
            while len(self._windows) > AUDIT_KEYS_MAX_COUNT:
                self._report(*self._windows.popitem(last=False))
        self._windows.move_to_end(key)
        if window.logged >= AUDIT_DENIALS_PER_KEY_PER_S:
            window.suppressed += 1
            window.reason, window.source = reason, source
            return
        window.logged += 1
        _log.warning(
            "denied",
            extra={
                "event": "auth",
                "decision": "deny",
                "reason": reason,
                "who": who,
                "what": method,
                "resource": resource,
                "source": source,
                "detail": detail,
            },
        )

    def sweep(self) -> None:
        """Report and forget the windows that are over (called at most once per window
        from :meth:`denied`, and by the gateway's auth refresh loop)."""
        now = self._clock()
        self._next_sweep = now + WINDOW_S
        over = [key for key, window in self._windows.items() if now - window.start >= WINDOW_S]
        for key in over:
            self._report(key, self._windows.pop(key))

    @staticmethod
    def _report(key: Key, window: _Window) -> None:
        if not window.suppressed:
            return
        who, method, resource = key
        _log.warning(
            "denials suppressed",
            extra={
                "event": "auth",
                "decision": "deny",
                "reason": window.reason,
                "who": who,
                "what": method,
                "resource": resource,
                "source": window.source,
                "suppressed": window.suppressed,
            },
        )

    @staticmethod
    def changed(who: str, what: str, resource: str, source: str) -> None:
        """A user or ACL change (allowed: it was authorized first)."""
        _log.info(
            "changed",
            extra={
                "event": "auth_change",
                "decision": "allow",
                "who": who,
                "what": what,
                "resource": resource,
                "source": source,
            },
        )

    def register_metric(self) -> None:
        def observe(_options: CallbackOptions) -> list[Observation]:
            return [Observation(self.denials[reason], {"reason": reason}) for reason in REASONS]

        service_meter("gateway").create_observable_counter(
            "tide_gateway_auth_denials_total",
            callbacks=[observe],
            unit="1",
            description="requests refused by authentication or authorization, by reason",
        )
