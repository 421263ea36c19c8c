"""Exponential backoff with jitter for reconnects."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Backoff:
    """Delay before reconnect attempt ``n`` (1-based): ``initial_s * factor**(n-1)``,
    capped at ``max_s``, then reduced by up to ``jitter`` (a fraction) at random so that
    many followers of one restarted server do not reconnect in lockstep."""

    initial_s: float = 0.05
    factor: float = 2.0
    max_s: float = 2.0
    jitter: float = 0.25
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError(f"need 0 < initial_s <= max_s (got {self.initial_s}, {self.max_s})")
        if self.factor < 1:
            raise ValueError(f"factor must be >= 1 (got {self.factor})")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"jitter must be in [0, 1) (got {self.jitter})")

    def delay_s(self, attempt: int) -> float:
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1 (got {attempt})")
        exponent = min(attempt - 1, 64)  # no float overflow however long the outage
        base = min(self.max_s, self.initial_s * self.factor**exponent)
        return base * (1 - self.jitter * self.rng.random())
