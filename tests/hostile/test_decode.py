"""Hostile records through the real decode path (:class:`~consumerkit.engine.decode.Decoder`,
the wire format of :mod:`consumerkit.envelope`): it answers an event or a
:class:`~consumerkit.DecodeError` with a stable reason, never anything else, and what a
failure logs is one safe line."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from consumerkit import DecodeError, Record, WireFormat
from consumerkit.engine.decode import Decoded, Decoder
from consumerkit.observability.logging import LogObserver
from consumerkit.route_table import RouteTable

from .handlers import EVENT_TYPES, Item, Moved, registry
from .logtext import check_lines, text_logs, unsafe
from .strategies import (
    dumps,
    event_ids,
    examples,
    header_names,
    hostile_bytes,
    hostile_text,
    raw_values,
    versions,
)

REASONS = frozenset({
    "empty_value", "oversized", "invalid_header", "missing_event_type", "unknown_event_type",
    "missing_event_id", "invalid_event_id", "invalid_timestamp", "unknown_version",
    "upcast_failed", "invalid_json", "invalid_payload", "invalid_key",
})
"""The reason codes of docs and DeadLetterEntry: a decode failure has one of these."""

MAX_BYTES = 64_000
ROUTES = RouteTable.build([registry])
WIRE_NAMES = frozenset({"id", "event_type", "event_version", "occurred_at", "aggregate_type",
               "correlation_id", "causation_id", "traceparent", "headers"})


WIRES = [WireFormat(), WireFormat(id_payload_field="id"), WireFormat(id_from_position=True)]

event_types = st.one_of(st.sampled_from(EVENT_TYPES), hostile_text)
header_values = st.one_of(st.none(), hostile_bytes)
timestamps = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1),
                       st.integers(-1, 300_000_000_000_000))
occurred = st.one_of(
    st.datetimes().map(lambda d: d.isoformat().encode()),
    st.sampled_from([b"2026-02-30T00:00:00Z", b"yesterday", b"9999-12-31T23:59:59+99:00"]),
    hostile_bytes)


@st.composite
def records(draw: st.DrawFn) -> Record:
    """A record with every part drawn: the wire format's headers (each present or not,
    well-formed or hostile, maybe repeated), junk headers, any key, value and timestamp."""
    headers: list[tuple[str, bytes | None]] = []
    if draw(st.booleans()):
        headers.append(("id", draw(event_ids).encode()))
    if draw(st.booleans()):
        headers.append(("event_type", draw(event_types).encode()))
    if draw(st.booleans()):
        headers.append(("event_version", draw(versions)))
    if draw(st.booleans()):
        headers.append(("occurred_at", draw(occurred)))
    headers += draw(st.lists(st.tuples(header_names, header_values), max_size=4))
    headers = draw(st.permutations(headers))
    value = draw(st.one_of(st.none(), raw_values, good_values()))
    return Record("items", draw(st.integers(-1, 3)),
                  draw(st.integers(-1, 2**63 - 1)), draw(st.one_of(st.none(), hostile_bytes)),
                  value, headers, draw(timestamps))


def good_values() -> st.SearchStrategy[bytes]:
    """Payloads a handler's model takes (version 1 or 2), with hostile field values."""
    ids, ns = hostile_text, st.integers(-(2**80), 2**80)
    return st.one_of(
        st.builds(lambda i, n: dumps({"id": i, "n": n}), ids, ns),
        st.builds(lambda i, n, w: dumps({"id": i, "n": n, "where": w}), ids, ns,
                  hostile_text),
        st.builds(lambda i, n, w: dumps({"id": i, "n": n, "place": w}), ids, ns,
                  hostile_text),
    )


def outcome(decoder: Decoder, record: Record) -> Decoded | DecodeError:
    """What decoding ``record`` gives: the event, or the DecodeError (anything else raises)."""
    try:
        return decoder.decode(record)
    except DecodeError as exc:
        return exc


@examples(400)
@given(record=records(), wire=st.sampled_from(WIRES))
def test_decoding_answers_an_event_or_a_decode_error_with_a_known_reason(
    record: Record, wire: WireFormat,
) -> None:
    decoder = Decoder(ROUTES, wire, MAX_BYTES)
    decoded = outcome(decoder, record)
    if isinstance(decoded, DecodeError):
        assert decoded.reason in REASONS, decoded.reason
        assert isinstance(decoded.detail, str)
        assert decoded.detail
        # the id the pipeline files a dead letter under: found or not, never raising
        assert decoder.event_id(record) is None or isinstance(decoder.event_id(record), str)
        return
    envelope = decoded.envelope
    assert isinstance(decoded.event, Item | Moved)
    assert envelope.event_type in EVENT_TYPES
    assert envelope.event_id == decoder.event_id(record)
    assert envelope.event_id.isprintable()
    assert 0 < len(envelope.event_id) <= wire.max_event_id_length


@examples(150)
@given(event_id=st.text(st.characters(codec="utf-8"), min_size=1, max_size=200).filter(
           str.isprintable),
       event_type=st.sampled_from(EVENT_TYPES), item=st.text(), n=st.integers(),
       junk=st.lists(st.tuples(header_names.filter(
                                   lambda name: name not in WIRE_NAMES),
                               header_values), max_size=5),
       key=st.one_of(st.none(), st.text()), wrap=st.sampled_from(["none", "string", "schema"]))
def test_a_good_record_decodes_whatever_junk_and_wrapping_come_with_it(
    event_id: str, event_type: str, item: str, n: int,
    junk: list[tuple[str, bytes | None]], key: str | None, wrap: str,
) -> None:
    doc = {"id": item, "n": n, "where": "shelf"}
    value = dumps(doc)
    if wrap == "string":  # Kafka Connect's JsonConverter without schemas
        value = orjson.dumps(value.decode())
    elif wrap == "schema":
        value = orjson.dumps({"schema": {"type": "string"}, "payload": value.decode()})
    headers = [*junk, ("id", event_id.encode()), ("event_type", event_type.encode())]
    record = Record("items", 0, 7, None if key is None else key.encode(), value, headers)
    decoded = Decoder(ROUTES, WireFormat(), MAX_BYTES).decode(record)
    assert decoded.envelope.event_id == event_id
    assert decoded.envelope.key == key
    assert (decoded.event.id, decoded.event.n) == (item, n)  # type: ignore[attr-defined]


@examples(150)
@given(raw=versions)
def test_a_version_header_is_a_version_from_1_or_a_reason(raw: bytes) -> None:
    value = orjson.dumps({"id": "i", "n": 1, "where": "w", "place": "p"})
    record = Record("items", 0, 0, None, value,
                    [("id", b"e"), ("event_type", b"item.moved"), ("event_version", raw)])
    decoded = outcome(Decoder(ROUTES, WireFormat(), MAX_BYTES), record)
    if isinstance(decoded, DecodeError):
        assert decoded.reason in {"invalid_header", "unknown_version"}, decoded
        text = raw.decode(errors="replace").strip()
        good = text.isascii() and text.isdigit() and 1 <= int(text) <= 2
        assert not good, f"version {raw!r} refused: {decoded}"
        return
    assert int(raw.decode().strip()) in (1, 2)
    assert isinstance(decoded.event, Moved)


@examples(200)
@given(record=records())
def test_a_decode_failure_logs_one_safe_line(record: Record) -> None:
    """What the pipeline logs when it dead-letters a record it cannot decode (the observer it
    calls, formatted by the text formatter): one line, no control character, bounded."""
    failed = outcome(Decoder(ROUTES, WireFormat(), MAX_BYTES), record)
    if isinstance(failed, DecodeError):
        with text_logs("consumerkit") as lines:
            LogObserver("hostile").dead_lettered(record, None, "", failed.reason,
                                                 failed.detail, 1)
        assert len(lines) == 1
        check_lines(lines)
        assert unsafe(failed.reason) is None
