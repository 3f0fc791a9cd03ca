"""One outbox row as the relay reads it and a sink sends it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """An event committed to the outbox, ready to publish.

    ``payload`` is the JSON document exactly as the writer stored it (UTF-8 bytes), so every
    re-publish sends the same bytes; ``occurred_at`` is the writer's time, sent with the event,
    so the event time is stable across re-publishes.
    """

    seq: int  # the row's position in the outbox; per aggregate, commit order
    event_id: UUID
    event_type: str
    aggregate_type: str
    aggregate_id: str
    payload: bytes
    occurred_at: datetime
    headers: Mapping[str, str] = field(default_factory=dict)
    attempts: int = 0  # failed publish attempts so far
