"""What Kafka Connect wraps around the wire format, undone by what the bytes themselves show,
so one consumer reads the relay's records and Debezium's whatever the connector's converters.

- Value: with ``StringConverter`` the EventRouter's payload is the JSON document itself (nothing
  to undo). ``JsonConverter`` without schemas writes the ``jsonb`` column, a string in Connect,
  as a JSON *string* (``"{\\"a\\": 1}"``); with schemas (Connect's default) as
  ``{"schema": {...}, "payload": ...}``. A handler's payload is a JSON object, so a value that
  is a JSON string, or an object of exactly ``schema`` (with a ``type``) and ``payload``, can
  only be one of these wrappings.
- Headers: the EventRouter can place a column in a header but not expand one, so the outbox's
  ``headers`` column (the writer's ``traceparent``, ``correlation_id``...) arrives as one
  header, :data:`HEADERS_HEADER`, holding a JSON object of strings. Its entries become headers
  of their own, as the relay sends them; a header of that name holding anything else is left
  as it is.
"""

from __future__ import annotations

import orjson

HEADERS_HEADER = "headers"
_SCHEMA_PREFIX = b'{"schema":'


def maybe_wrapped(value: bytes) -> bool:
    """Cheap test: could ``value`` be a Connect JSON wrapping (see :func:`unwrap_value`)?"""
    return value[:1] == b'"' or value[:10] == _SCHEMA_PREFIX


def unwrap_value(value: bytes) -> bytes:
    """The JSON payload inside a Connect ``JsonConverter`` wrapping, or ``value`` unchanged
    when it is none (or not JSON at all: the payload model then says why)."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
    if isinstance(doc, dict) and doc.keys() == {"schema", "payload"} and isinstance(
            doc["schema"], dict) and "type" in doc["schema"]:
        doc = doc["payload"]
        if not isinstance(doc, str):
            return orjson.dumps(doc)
    if isinstance(doc, str):
        return doc.encode()
    return value


def unfold_headers(headers: dict[str, bytes]) -> dict[str, bytes]:
    """``headers`` with the JSON object of :data:`HEADERS_HEADER` spread into headers of its
    own (a header sent on its own wins over one of the same name inside the object)."""
    try:
        inner = orjson.loads(headers[HEADERS_HEADER])
    except orjson.JSONDecodeError:
        return headers
    if not isinstance(inner, dict) or not all(isinstance(v, str) for v in inner.values()):
        return headers
    unfolded = {name: value.encode() for name, value in inner.items()}
    unfolded.update((k, v) for k, v in headers.items() if k != HEADERS_HEADER)
    return unfolded
