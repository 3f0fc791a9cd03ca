"""A message that could not be applied, with why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from ..display import displayable

DETAIL_LIMIT = 2000
"""Characters kept of a detail: it often quotes the record (an event type, an error about its
values), and a listing or a header shows it in one line."""


def shown_detail(detail: str) -> str:
    """``detail`` as the sinks store it: escaped (no newline or escape sequence can forge a
    line where it is listed) and cut at :data:`DETAIL_LIMIT` with its length noted."""
    return displayable(detail, DETAIL_LIMIT)


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """One dead-lettered record: its raw bytes, its position and the reason.

    ``reason`` is a stable code (``empty_value``, ``oversized``, ``invalid_header``,
    ``missing_event_type``, ``unknown_event_type``, ``missing_event_id``, ``invalid_event_id``,
    ``invalid_timestamp``, ``unknown_version``, ``upcast_failed``, ``invalid_json``,
    ``invalid_payload``, ``invalid_key``,
    ``handler_failed``, ``dead_lettered_by_handler``, ``expired``);
    ``detail`` is the human-readable explanation, stored as :func:`shown_detail` makes it (a
    database error's DETAIL, which quotes the row's values, is left out of it: see
    :func:`consumerkit.shared.failures.describe`). A header value may be ``None``: Kafka
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
