"""Bounded retries with exponential back-off and full jitter."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from .errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a failing handler is retried before dead-lettering.

    Attempt ``n`` (1-based) that fails waits a random time in
    ``[delay/2, delay]`` with ``delay = min(max_delay, initial_delay * multiplier ** (n - 1))``
    before attempt ``n + 1``. After ``max_attempts`` failures the message is dead-lettered.
    Keep the total well below the broker's ``max_poll_interval_ms``.

    ``on_exhausted="park"`` parks the record's key instead (see docs/parking.md): the record
    and every later one of its key on the partition wait for ``consumerkit parked replay``,
    while other keys flow. A handler's own ``@handler(..., on_exhausted=...)`` wins.
    """

    max_attempts: int = 5
    initial_delay: float = 0.2
    max_delay: float = 10.0
    multiplier: float = 2.0
    on_exhausted: Literal["dead_letter", "park"] = "dead_letter"

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigurationError("max_attempts must be at least 1")
        if self.initial_delay < 0 or self.max_delay < self.initial_delay:
            raise ConfigurationError("need 0 <= initial_delay <= max_delay")
        if self.multiplier < 1:
            raise ConfigurationError("multiplier must be at least 1")
        if self.on_exhausted not in ("dead_letter", "park"):
            raise ConfigurationError(
                f"on_exhausted must be 'dead_letter' or 'park', not {self.on_exhausted!r}")

    def delay(self, failed_attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``failed_attempt`` (1-based)."""
        base = min(self.max_delay, self.initial_delay * self.multiplier ** (failed_attempt - 1))
        return (rng or random).uniform(base / 2, base)
