"""The event envelope and the wire format it is read from.

Wire format (what a transactional outbox publishes, e.g. Debezium's EventRouter configured as
in docs/wire-format.md): record key = aggregate id (UTF-8); value = the JSON payload; headers ``id``
(event id), ``event_type``, optional ``occurred_at`` (RFC 3339), ``aggregate_type``,
``correlation_id``, ``causation_id``, ``traceparent``, ``event_version`` (the payload's schema
version, absent = 1; see :mod:`consumerkit.versions`). Header names are set by :class:`WireFormat`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

IdSource = Literal["header", "payload", "position"]


class RecordLike(Protocol):
    """What consumerkit reads from a broker record (aiokafka's ``ConsumerRecord`` fits).

    Kafka allows a null header value, and a record may carry no timestamp (``None``, or ``-1``
    from old message formats): both are typed so that every reader has to handle them.
    """

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int | None: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Sequence[tuple[str, bytes | None]]: ...


@dataclass(frozen=True, slots=True)
class Record:
    """A plain broker record: the in-memory and test form of :class:`RecordLike`."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp: int | None = 0


@dataclass(frozen=True, slots=True)
class WireFormat:
    """Header names, and where an event id comes from when the ``id`` header is absent.

    The id fallback chain is: the ``id`` header; then ``id_payload_field`` (a top-level JSON
    field of the payload) if set; then the record position ``topic/partition/offset`` if
    ``id_from_position`` is true. A position id is unique per record, so it does not absorb a
    re-published duplicate: use it only for producers that never re-publish.
    """

    id_header: str = "id"
    event_type_header: str = "event_type"
    occurred_at_header: str = "occurred_at"
    aggregate_type_header: str = "aggregate_type"
    correlation_id_header: str = "correlation_id"
    causation_id_header: str = "causation_id"
    traceparent_header: str = "traceparent"
    id_payload_field: str | None = None
    id_from_position: bool = False
    max_event_id_length: int = 200
    event_version_header: str = "event_version"


@dataclass(frozen=True, slots=True)
class Envelope:
    """One event as a handler sees it: identity, routing, position and metadata.

    ``timestamp`` is ``None`` when the record carries no usable time (none at all, or Kafka's
    ``-1`` for "unknown"): inventing one would make the event look decades old and expire it.
    """

    event_id: str
    id_source: IdSource
    event_type: str | None
    key: str | None
    topic: str
    partition: int
    offset: int
    timestamp: datetime | None
    occurred_at: datetime | None = None
    aggregate_type: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    traceparent: str | None = None
    headers: Mapping[str, bytes] = field(default_factory=dict)

    @property
    def event_time(self) -> datetime | None:
        """When the event happened: ``occurred_at`` if sent, else the record timestamp, else
        ``None`` (unknown: the dedup window is then not enforced for this event)."""
        return self.occurred_at or self.timestamp
