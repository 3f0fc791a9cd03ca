"""The decoder reads what Kafka Connect and Debezium's EventRouter wrap around the wire format,
by what the bytes show, with no setting: JsonConverter's string and schema envelopes around the
payload, and the writer's headers placed as one JSON header."""

from __future__ import annotations

import orjson
import pytest

from consumerkit import Record, WireFormat
from consumerkit.engine.decode import Decoded, Decoder

from .test_decode import GOOD, ROUTES, OrderCreated, reason, record

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
BASE = [("id", b"evt-1"), ("event_type", b"order.created")]


def decoded(rec: Record) -> Decoded:
    return Decoder(ROUTES, WireFormat(), 10_000).decode(rec)


@pytest.mark.parametrize("value", [
    GOOD,  # StringConverter: the document itself
    orjson.dumps(GOOD.decode()),  # JsonConverter, schemas off: a JSON string of the document
    orjson.dumps({"schema": {"type": "string", "optional": False,
                             "name": "io.debezium.data.Json"}, "payload": GOOD.decode()}),
    orjson.dumps({"schema": {"type": "struct", "fields": []},  # expand.json.payload on
                  "payload": orjson.loads(GOOD)}),
], ids=["string-converter", "json-string", "json-schema-string", "json-schema-object"])
def test_every_connect_encoding_of_the_payload_gives_the_same_event(value: bytes) -> None:
    assert decoded(record(value=value)).event == OrderCreated(order_id="o-1", amount=5)


def test_what_only_looks_wrapped_is_judged_by_the_payload_model() -> None:
    assert reason(record(value=b'"not json inside"')) == "invalid_json"
    assert reason(record(value=b'"[1, 2]"')) == "invalid_payload"
    # an object with more than schema and payload is a payload of its own
    other = orjson.dumps({"schema": {"type": "x"}, "payload": "{}", "order_id": "o"})
    assert reason(record(value=other)) == "invalid_payload"


def test_the_writers_headers_placed_as_one_json_header_become_headers() -> None:
    inner = {"traceparent": TRACE, "correlation_id": "c-1", "causation_id": "c-0"}
    env = decoded(record(headers=[*BASE, ("headers", orjson.dumps(inner))])).envelope
    assert (env.traceparent, env.correlation_id, env.causation_id) == (TRACE, "c-1", "c-0")
    assert env.headers == {"id": b"evt-1", "event_type": b"order.created",
                           **{k: v.encode() for k, v in inner.items()}}
    # the same envelope as from the relay's record, whose headers are separate
    relay = decoded(record(headers=[*BASE, *((k, v.encode()) for k, v in inner.items())]))
    assert env == relay.envelope


def test_a_header_sent_on_its_own_wins_and_other_headers_values_are_left_alone() -> None:
    own = decoded(record(headers=[*BASE, ("traceparent", b"00-own-01"),
                                  ("headers", b'{"traceparent": "00-inner-01"}')])).envelope
    assert own.traceparent == "00-own-01"
    for value in (b"plain text", b'["a"]', b'{"n": 1}'):
        env = decoded(record(headers=[*BASE, ("headers", value)])).envelope
        assert env.headers["headers"] == value
        assert env.traceparent is None
