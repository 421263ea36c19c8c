"""Audit events (issue 22): every refused request and every user/ACL change, as one
structured line on the ``tide.audit`` logger (who, what, resource, source address,
decision), and the denial totals behind ``tide_gateway_auth_denials_total{reason}``.

An event names the access key, never a secret key or a signature.
"""

from __future__ import annotations

import logging
from collections import Counter

from opentelemetry.metrics import CallbackOptions, Observation

from tide.server import service_meter

AUDIT_LOGGER = "tide.audit"
_log = logging.getLogger(AUDIT_LOGGER)
# The reasons a denial is counted under (bounded: the metric's label values).
REASONS = ("unauthenticated", "forbidden", "unknown_method")


class Audit:
    def __init__(self) -> None:
        self.denials: Counter[str] = Counter()

    def denied(
        self, reason: str, who: str, method: str, resource: str, source: str, detail: str
    ) -> None:
        self.denials[reason] += 1
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
