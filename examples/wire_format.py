"""Producing records in the wire format consumerkit reads, and reading a different one."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from consumerkit import WireFormat


def wire_headers(
    event_id: str, event_type: str, *, occurred_at: datetime | None = None,
    correlation_id: str | None = None,
) -> list[tuple[str, bytes]]:
    """The headers of one event under the default :class:`WireFormat`."""
    headers = [("id", event_id.encode()), ("event_type", event_type.encode())]
    if occurred_at is not None:
        headers.append(("occurred_at", occurred_at.isoformat().encode()))
    if correlation_id is not None:
        headers.append(("correlation_id", correlation_id.encode()))
    return headers


async def publish(
    producer: Any, topic: str, *, key: str, event_id: str, event_type: str,
    payload: BaseModel,
) -> None:
    """Send one event with a started ``aiokafka.AIOKafkaProducer``.

    ``event_id`` is created once, where the event is created, and stored with it: a re-send
    must carry the same id, or the consumer cannot recognise it as a duplicate.
    """
    headers = wire_headers(event_id, event_type, occurred_at=datetime.now(UTC))
    value = payload.model_dump_json().encode()
    await producer.send_and_wait(topic, key=key.encode(), value=value, headers=headers)


# A producer with its own header names, which puts the event id in the payload
# (top-level "uuid") when it has no "message-id" header.
legacy_wire = WireFormat(
    id_header="message-id",
    event_type_header="type",
    occurred_at_header="created-at",
    id_payload_field="uuid",
)

# A producer that never re-sends and sets no id at all: the record position is the id.
position_wire = WireFormat(id_from_position=True)
