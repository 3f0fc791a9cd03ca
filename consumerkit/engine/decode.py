"""From a broker record to a routed, validated event, or a :class:`DecodeError` whose reason
code says why not (the pipeline dead-letters it). The one place that reads the wire format."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import NoReturn

import orjson
from pydantic import BaseModel, ValidationError

from ..envelope import Envelope, IdSource, RecordLike, WireFormat
from ..errors import DecodeError
from ..registry import Route
from ..route_table import RouteTable
from ..versions import read_version, upcast_json
from .cdc import HEADERS_HEADER, maybe_wrapped, unfold_headers, unwrap_value
from .frozen import maker
from .unhandled import Skipped, TypePolicy, Unhandled


@dataclass(frozen=True, slots=True)
class Decoded:
    envelope: Envelope
    route: Route
    event: BaseModel


_envelope = maker(Envelope)
_decoded = maker(Decoded)
_TIMES_KEPT = 4096  # distinct record times remembered (each one a datetime of its own)


def header_map(record: RecordLike) -> dict[str, bytes]:
    """Record headers as a dict (the last value of a repeated name wins; nulls are dropped)."""
    headers: dict[str, bytes | None] = dict(record.headers or ())  # no Python loop: usual
    if None in headers.values():
        return {name: value for name, value in record.headers if value is not None}
    return headers  # type: ignore[return-value]  # no None in it, as just checked


def header_text(headers: dict[str, bytes], name: str) -> str | None:
    raw = headers.get(name)
    return None if raw is None else _text(raw, name)


def _text(raw: bytes, name: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid_header", f"header {name!r} is not UTF-8") from exc


def _optional(get: Callable[[str], bytes | None], name: str) -> str | None:
    raw = get(name)
    return None if raw is None else _text(raw, name)


class Decoder:
    """Decodes records for one consumer: size limit, headers, key, route, id, payload."""

    def __init__(self, routes: RouteTable, wire: WireFormat, max_bytes: int,
                 types: TypePolicy | None = None) -> None:
        self.routes = routes
        self.types = types or TypePolicy()
        # event types without a handler: their fate, and a handled type close to them
        self._fates: dict[str, tuple[Unhandled, str | None]] = {}
        self.wire = wire
        self.max_bytes = max_bytes
        self._times: dict[int | None, datetime | None] = {}  # record times seen lately
        optional = {wire.occurred_at_header, wire.aggregate_type_header,
                    wire.correlation_id_header, wire.causation_id_header,
                    wire.traceparent_header}
        # whether a record with no header but its type and id has none of the optional ones
        self._lean = not optional & {wire.id_header, wire.event_type_header}

    def decode(self, record: RecordLike) -> Decoded:
        value = record.value
        if value is None:
            raise DecodeError("empty_value", "the record has no value (a tombstone?)")
        if len(value) > self.max_bytes:
            raise DecodeError(
                "oversized", f"value of {len(value)} bytes exceeds the {self.max_bytes} limit"
            )
        if maybe_wrapped(value):  # Kafka Connect's JsonConverter, see engine.cdc
            value = unwrap_value(value)
        headers = header_map(record)
        if HEADERS_HEADER in headers:  # Debezium's EventRouter, see engine.cdc
            headers = unfold_headers(headers)
        wire = self.wire
        event_type = header_text(headers, wire.event_type_header)
        route = self.routes.find(event_type, record.topic)
        if route is None:
            self._unrouted(record.topic, event_type)
        event_id, id_source = self._event_id(record, headers, value)
        version = read_version(headers.get(wire.event_version_header), wire.event_version_header)
        try:
            if version == route.version:
                event = route.model.model_validate_json(value)
            else:  # the upcasters run on the JSON document, before validation
                event = route.model.model_validate_json(upcast_json(
                    value, event_type, version, route.version,
                    self.routes.chains.get(route.event_type or "")))
        except DecodeError:
            raise
        except ValidationError as exc:
            kind = exc.errors()[0]["type"] if exc.error_count() else ""
            reason = "invalid_json" if kind == "json_invalid" else "invalid_payload"
            raise DecodeError(reason, _short(exc)) from exc
        except Exception as exc:  # a model validator raising e.g. TypeError or KeyError
            raise DecodeError("invalid_payload", f"{type(exc).__name__}: {exc}"[:500]) from exc
        timestamp = record.timestamp
        when = self._times.get(timestamp)  # the records of a fetch often share their time
        if when is None:
            when = record_time(timestamp)
            if len(self._times) >= _TIMES_KEPT:
                self._times.clear()
            self._times[timestamp] = when
        # the optional headers are often all absent: no header beyond the type and the id
        if not self._lean or len(headers) > (event_type is not None) + (id_source == "header"):
            get = headers.get
            occurred = get(wire.occurred_at_header)
            envelope = _envelope(  # Envelope's fields, in order
                event_id, id_source, event_type, _key(record.key), record.topic,
                record.partition, record.offset, when,
                None if occurred is None else _timestamp(
                    _text(occurred, wire.occurred_at_header)),
                _optional(get, wire.aggregate_type_header),
                _optional(get, wire.correlation_id_header),
                _optional(get, wire.causation_id_header),
                _optional(get, wire.traceparent_header),
                headers,
            )
        else:
            envelope = _envelope(
                event_id, id_source, event_type, _key(record.key), record.topic,
                record.partition, record.offset, when, None, None, None, None, None, headers)
        return _decoded(envelope, route, event)

    def _unrouted(self, topic: str, event_type: str | None) -> NoReturn:
        """Raise what becomes of a record no handler takes: :class:`Skipped`, or the
        :class:`DecodeError` that sends it to the dead letters."""
        if event_type is None:
            raise DecodeError(
                "missing_event_type",
                f"no {self.wire.event_type_header!r} header and no handler for topic "
                f"{topic!r}",
            )
        verdict = self._fates.get(event_type)
        if verdict is None:  # decided once per type, not per record
            verdict = self.types.fate(event_type), self.types.near(event_type)
            if len(self._fates) < _TIMES_KEPT:
                self._fates[event_type] = verdict
        fate, near = verdict
        if fate == "skip":
            raise Skipped(event_type, near)
        hint = f" (a handler takes {near!r}: misspelt?)" if near else ""
        raise DecodeError("unknown_event_type",
                          f"no handler for event type {event_type!r}{hint}")

    def event_type(self, record: RecordLike) -> str | None:
        """The record's event type as :meth:`decode` reads it (``None``: it has none or it is
        unusable); never raises."""
        try:
            headers = header_map(record)
            if HEADERS_HEADER in headers:
                headers = unfold_headers(headers)
            return header_text(headers, self.wire.event_type_header)
        except DecodeError:
            return None

    def event_id(self, record: RecordLike) -> str | None:
        """The record's event id as :meth:`decode` would find it, or ``None`` when it has
        none (or the record is unusable); never raises."""
        if record.value is None:
            return None
        try:
            return self._event_id(record, header_map(record), record.value)[0]
        except DecodeError:
            return None

    def _event_id(
        self, record: RecordLike, headers: dict[str, bytes], value: bytes
    ) -> tuple[str, IdSource]:
        wire = self.wire
        candidate = header_text(headers, wire.id_header)
        source: IdSource = "header"
        if not candidate and wire.id_payload_field is not None:
            candidate, source = _payload_field(value, wire.id_payload_field), "payload"
        if not candidate and wire.id_from_position:
            candidate = f"{record.topic}/{record.partition}/{record.offset}"
            source = "position"
        if not candidate:
            raise DecodeError("missing_event_id", f"the {wire.id_header!r} header is empty"
                              if wire.id_header in headers else f"no {wire.id_header!r} header")
        if not candidate.isprintable():
            raise DecodeError("invalid_event_id", "event id contains control characters")
        if len(candidate) > wire.max_event_id_length:
            raise DecodeError(
                "invalid_event_id",
                f"event id of {len(candidate)} characters exceeds {wire.max_event_id_length}",
            )
        return candidate, source


def _payload_field(value: bytes, name: str) -> str | None:
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise DecodeError("invalid_json", str(exc)) from exc
    found = doc.get(name) if isinstance(doc, dict) else None
    return str(found) if isinstance(found, str | int) and not isinstance(found, bool) else None


def _key(raw: bytes | None) -> str | None:
    if raw is None:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise DecodeError("invalid_key", "the record key is not UTF-8") from exc


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def record_time(timestamp_ms: int | None) -> datetime | None:
    """A record timestamp (milliseconds since the epoch) as an aware UTC datetime.

    ``None`` when the record has no time: missing, or negative (Kafka's ``-1`` means unknown);
    read as a time it would be 1969 and every such event would look expired. A time outside
    ``datetime``'s range (year 1 to 9999) is a broken record, reported as a decode failure so
    the record is dead-lettered instead of crashing the consumer. Integer arithmetic, not
    ``fromtimestamp``: exact to the millisecond and the same on every platform.
    """
    if timestamp_ms is None or timestamp_ms < 0:
        return None
    try:
        return _EPOCH + timedelta(milliseconds=timestamp_ms)
    except (OverflowError, ValueError) as exc:
        raise DecodeError(
            "invalid_timestamp", f"record timestamp {timestamp_ms} ms is out of range") from exc


def _timestamp(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError as exc:
        raise DecodeError("invalid_header", f"occurred_at {text[:64]!r} is not RFC 3339") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _short(exc: ValidationError) -> str:
    parts = [
        f"{'.'.join(str(p) for p in err['loc']) or '<root>'}: {err['msg']}"
        for err in exc.errors(include_url=False, include_input=False)[:5]
    ]
    return "; ".join(parts)
