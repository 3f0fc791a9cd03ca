"""A message that could not be applied, with why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """One dead-lettered record: its raw bytes, its position and the reason.

    ``reason`` is a stable code (``empty_value``, ``oversized``, ``invalid_header``,
    ``missing_event_type``, ``unknown_event_type``, ``missing_event_id``, ``invalid_event_id``,
    ``invalid_timestamp``, ``unknown_version``, ``upcast_failed``, ``invalid_json``,
    ``invalid_payload``, ``invalid_key``,
    ``handler_failed``, ``dead_lettered_by_handler``, ``expired``);
    ``detail`` is the human-readable explanation. A header value may be ``None``: Kafka
    allows null header values, and the entry keeps the record as it was.
    """

    consumer: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    reason: str
    detail: str
    attempts: int = 0
    event_id: str | None = None
    event_type: str | None = None
    failed_at: datetime = field(default_factory=lambda: datetime.now(UTC))
