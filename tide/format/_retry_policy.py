"""Retry policies of a consumer group: how long send-back waits before attempt ``n + 1``.

docs/formats.md, "Retry policies". RocketMQ 5's ``GroupRetryPolicy`` (a type and one
policy of each kind, either absent) as stored in ``subscriptionGroup.json``:

* CUSTOMIZED (the default): a list of delays; attempt ``r`` (the message's reconsume times
  so far) waits ``next[min(r + 2, len - 1)]``. The default list is the default delay level
  table, so this is RocketMQ 4's send-back (level ``3 + r``) in ms.
* EXPONENTIAL: ``min(max, initial * multiplier ** min(r, 32))``, by default 5 s doubling
  to 2 h.

A missing policy of the chosen type means the default CUSTOMIZED list, as in RocketMQ.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tide.files import ConfigFormatError
from tide.format._config_json import as_object, show, typed_field
from tide.format._delay_levels import DEFAULT_DELAY_LEVEL_TABLE, MAX_DELAY_LEVELS
from tide.format._timer_wheel import DEFAULT_TIMER_MAX_DELAY_S

MAX_RETRY_DELAY_MS = DEFAULT_TIMER_MAX_DELAY_S * 1000
"""Longest wait before a retry (3 days): a retry is a timed message, so no longer than the
timer's default maximum delay."""
MAX_CUSTOM_RETRY_DELAYS = MAX_DELAY_LEVELS
"""Longest CUSTOMIZED list (64): it stands for a delay level table."""
MAX_RETRY_MULTIPLIER = 100
"""Largest EXPONENTIAL multiplier; the delays reach the max within a few attempts anyway."""
EXPONENTIAL_MAX_POWER = 32  # ExponentialRetryPolicy caps reconsume times at 32
DEFAULT_EXPONENTIAL_INITIAL_MS = 5_000
DEFAULT_EXPONENTIAL_MAX_MS = 2 * 3600 * 1000
DEFAULT_EXPONENTIAL_MULTIPLIER = 2
# CustomizedRetryPolicy: index reconsume_times + 2, because the old delay level was
# reconsume_times + 3 and levels count from 1.
_CUSTOMIZED_INDEX_SHIFT = 2


class RetryPolicyType(enum.Enum):
    EXPONENTIAL = "EXPONENTIAL"
    CUSTOMIZED = "CUSTOMIZED"


@dataclass(frozen=True, slots=True)
class ExponentialRetryPolicy:
    initial_ms: int = DEFAULT_EXPONENTIAL_INITIAL_MS
    max_ms: int = DEFAULT_EXPONENTIAL_MAX_MS
    multiplier: int = DEFAULT_EXPONENTIAL_MULTIPLIER

    def __post_init__(self) -> None:
        _check_delay("exponentialRetryPolicy.initial", self.initial_ms)
        _check_delay("exponentialRetryPolicy.max", self.max_ms)
        if self.max_ms < self.initial_ms:
            raise ConfigFormatError(
                f"exponentialRetryPolicy: max {self.max_ms} ms is below initial "
                f"{self.initial_ms} ms"
            )
        if type(self.multiplier) is not int or not 1 <= self.multiplier <= MAX_RETRY_MULTIPLIER:
            raise ConfigFormatError(
                f"exponentialRetryPolicy.multiplier is {show(self.multiplier)}; it must be "
                f"1..{MAX_RETRY_MULTIPLIER}"
            )

    def next_delay_ms(self, reconsume_times: int) -> int:
        """Exact integers: where RocketMQ's long product overflows (big multipliers late
        in the list) Tide still answers ``max``."""
        power = min(max(reconsume_times, 0), EXPONENTIAL_MAX_POWER)
        product: int = self.initial_ms * self.multiplier**power
        return min(self.max_ms, product)

    def to_json(self) -> dict[str, object]:
        return {"initial": self.initial_ms, "max": self.max_ms, "multiplier": self.multiplier}

    @classmethod
    def from_json(cls, raw: object) -> ExponentialRetryPolicy:
        where = "exponentialRetryPolicy"
        doc = as_object(raw, where)
        return cls(
            initial_ms=typed_field(doc, where, "initial", int, DEFAULT_EXPONENTIAL_INITIAL_MS),
            max_ms=typed_field(doc, where, "max", int, DEFAULT_EXPONENTIAL_MAX_MS),
            multiplier=typed_field(doc, where, "multiplier", int, DEFAULT_EXPONENTIAL_MULTIPLIER),
        )


@dataclass(frozen=True, slots=True)
class CustomizedRetryPolicy:
    next_ms: tuple[int, ...] = DEFAULT_DELAY_LEVEL_TABLE.delays_ms

    def __post_init__(self) -> None:
        if not 1 <= len(self.next_ms) <= MAX_CUSTOM_RETRY_DELAYS:
            raise ConfigFormatError(
                f"customizedRetryPolicy.next has {len(self.next_ms)} delays; "
                f"it needs 1..{MAX_CUSTOM_RETRY_DELAYS}"
            )
        for index, delay_ms in enumerate(self.next_ms):
            _check_delay(f"customizedRetryPolicy.next[{index}]", delay_ms)

    def next_delay_ms(self, reconsume_times: int) -> int:
        index = max(reconsume_times, 0) + _CUSTOMIZED_INDEX_SHIFT
        return self.next_ms[min(index, len(self.next_ms) - 1)]

    def to_json(self) -> dict[str, object]:
        return {"next": list(self.next_ms)}

    @classmethod
    def from_json(cls, raw: object) -> CustomizedRetryPolicy:
        where = "customizedRetryPolicy"
        doc = as_object(raw, where)
        delays = typed_field(doc, where, "next", list, list(DEFAULT_DELAY_LEVEL_TABLE.delays_ms))
        if len(delays) > MAX_CUSTOM_RETRY_DELAYS:  # before looking at each one
            raise ConfigFormatError(
                f"{where}.next has {len(delays)} delays; it needs 1..{MAX_CUSTOM_RETRY_DELAYS}"
            )
        return cls(tuple(delays))


@dataclass(frozen=True, slots=True)
class GroupRetryPolicy:
    type: RetryPolicyType = RetryPolicyType.CUSTOMIZED
    exponential: ExponentialRetryPolicy | None = None
    customized: CustomizedRetryPolicy | None = None

    def effective(self) -> ExponentialRetryPolicy | CustomizedRetryPolicy:
        """``GroupRetryPolicy.getRetryPolicy``: the chosen kind, or the default list."""
        if self.type is RetryPolicyType.EXPONENTIAL and self.exponential is not None:
            return self.exponential
        if self.type is RetryPolicyType.CUSTOMIZED and self.customized is not None:
            return self.customized
        return CustomizedRetryPolicy()

    def next_delay_ms(self, reconsume_times: int) -> int:
        """How long send-back waits after the message failed ``reconsume_times + 1`` times."""
        return self.effective().next_delay_ms(reconsume_times)

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {}
        if self.customized is not None:
            doc["customizedRetryPolicy"] = self.customized.to_json()
        if self.exponential is not None:
            doc["exponentialRetryPolicy"] = self.exponential.to_json()
        doc["type"] = self.type.value
        return doc

    @classmethod
    def from_json(cls, raw: object) -> GroupRetryPolicy:
        where = "groupRetryPolicy"
        doc = as_object(raw, where)
        kind = typed_field(doc, where, "type", str, RetryPolicyType.CUSTOMIZED.value)
        if kind not in RetryPolicyType.__members__:
            raise ConfigFormatError(
                f"{where}.type is {show(kind)}; it must be EXPONENTIAL or CUSTOMIZED"
            )
        exponential = doc.get("exponentialRetryPolicy")
        customized = doc.get("customizedRetryPolicy")
        return cls(
            type=RetryPolicyType(kind),
            exponential=None
            if exponential is None
            else ExponentialRetryPolicy.from_json(exponential),
            customized=None if customized is None else CustomizedRetryPolicy.from_json(customized),
        )


def should_dead_letter(reconsume_times: int, max_reconsume_times: int) -> bool:
    """Send-back goes to the dead-letter topic once the message was reconsumed
    ``max_reconsume_times`` times (``AbstractSendMessageProcessor``)."""
    return reconsume_times >= max_reconsume_times


def _check_delay(name: str, delay_ms: object) -> None:
    if type(delay_ms) is not int or not 0 < delay_ms <= MAX_RETRY_DELAY_MS:
        raise ConfigFormatError(
            f"{name} is {show(delay_ms)}; a retry delay must be 1..{MAX_RETRY_DELAY_MS} ms "
            "(3 days, the timer's maximum delay)"
        )
