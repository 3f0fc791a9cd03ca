"""How a record left the pipeline: the one answer the engine, the batcher and the tests read."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    DEAD_LETTERED = "dead_lettered"
    EXPIRED_SKIPPED = "expired_skipped"
    UNHANDLED_SKIPPED = "unhandled_skipped"  # no handler takes its event type: not ours
    PARKED = "parked"  # held back with its key: the offset moves on
    ABANDONED = "abandoned"  # not finished: the offset must not move past it
