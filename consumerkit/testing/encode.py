"""A pydantic event as a producer (an outbox relay, say) sends it: the JSON value and the
wire format's headers, as :meth:`~consumerkit.testing.TestConsumer.publish` appends it."""

from __future__ import annotations

import uuid
from datetime import datetime

from pydantic import BaseModel

from ..envelope import WireFormat
from ..errors import ConfigurationError
from ..route_table import RouteTable
from ..versions import model_version


def encode(wire: WireFormat, routes: RouteTable, event: BaseModel, *, event_type: str | None,
           event_id: str | None, occurred_at: datetime | None,
           ) -> tuple[list[tuple[str, bytes | None]], bytes]:
    """The headers and value of ``event``: its id (a new UUID unless ``event_id``), its type
    (from the handler whose model it is, unless ``event_type``), ``occurred_at`` if given, and
    its version if its model declares one."""
    sent: list[tuple[str, bytes | None]] = [
        (wire.id_header, (event_id or str(uuid.uuid4())).encode()),
        (wire.event_type_header, _event_type(routes, event, event_type).encode())]
    if occurred_at is not None:
        sent.append((wire.occurred_at_header, occurred_at.isoformat().encode()))
    if (version := model_version(type(event))) is not None:
        sent.append((wire.event_version_header, str(version).encode()))
    return sent, event.model_dump_json().encode()


def _event_type(routes: RouteTable, event: BaseModel, given: str | None) -> str:
    if given is not None:
        return given
    found = sorted(t for t, r in routes.by_type.items() if r.model is type(event))
    if len(found) != 1:
        raise ConfigurationError(
            f"no single handler takes {type(event).__name__} (found {found}): "
            "pass event_type=")
    return found[0]
