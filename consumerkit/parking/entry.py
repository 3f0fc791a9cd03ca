"""A parked record and a parked key, as stored and as listed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from ..envelope import Record


@dataclass(frozen=True, slots=True)
class ParkedRecord:
    """One record held back because its key is parked: its exact bytes, its position, why.

    ``reason`` is ``handler_failed`` for the record whose retries ran out (the culprit) and
    ``key_parked`` for the records of its key that came after it."""

    consumer: str
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    timestamp_ms: int | None
    reason: str
    detail: str
    attempts: int = 0
    event_id: str | None = None
    event_type: str | None = None
    id: int | None = None  # the row's id, once stored
    parked_at: datetime | None = None

    def record(self) -> Record:
        """The broker record as it was delivered, to be decoded and applied again."""
        return Record(self.topic, self.partition, self.offset, self.key, self.value,
                      tuple(self.headers), self.timestamp_ms)


@dataclass(frozen=True, slots=True)
class ParkedKey:
    """A key parked on one partition of a consumer's topics, and what waits behind it."""

    consumer: str
    topic: str
    partition: int
    key: bytes
    reason: str
    detail: str
    parked_at: datetime
    records: int
    first_offset: int | None

    @property
    def key_text(self) -> str:
        return self.key.decode(errors="backslashreplace")
