from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel, field_validator

from consumerkit import DecodeError, HandlerContext, Record, WireFormat, handler
from consumerkit.engine.decode import Decoder, record_time
from consumerkit.route_table import RouteTable


class OrderCreated(BaseModel):
    order_id: str
    amount: int


@handler("order.created")
async def charge(event: OrderCreated, ctx: HandlerContext) -> None:
    del event, ctx


ROUTES = RouteTable.build([charge])
GOOD = b'{"order_id": "o-1", "amount": 5}'


def record(value: bytes | None = GOOD,
           headers: Sequence[tuple[str, bytes | None]] | None = None,
           key: bytes | None = b"o-1", offset: int = 7,
           timestamp: int | None = 1_700_000_000_000) -> Record:
    if headers is None:
        headers = [("id", b"evt-1"), ("event_type", b"order.created")]
    return Record("orders", 2, offset, key, value, headers, timestamp=timestamp)


def decode(rec: Record, wire: WireFormat | None = None, limit: int = 1000) -> object:
    return Decoder(ROUTES, wire or WireFormat(), limit).decode(rec)


def reason(rec: Record, wire: WireFormat | None = None, limit: int = 1000) -> str:
    with pytest.raises(DecodeError) as info:
        decode(rec, wire, limit)
    return info.value.reason


def test_a_good_record_becomes_an_envelope_and_a_model() -> None:
    headers = [("id", b"evt-1"), ("event_type", b"order.created"),
               ("occurred_at", b"2026-11-20T10:00:00Z"), ("correlation_id", b"c-9"),
               ("traceparent", b"00-abc-def-01"), ("aggregate_type", b"order"),
               ("causation_id", b"c-8")]
    decoded = Decoder(ROUTES, WireFormat(), 1000).decode(record(headers=headers))
    env = decoded.envelope
    assert decoded.event == OrderCreated(order_id="o-1", amount=5)
    assert (env.event_id, env.id_source, env.event_type, env.key) == (
        "evt-1", "header", "order.created", "o-1")
    assert (env.topic, env.partition, env.offset) == ("orders", 2, 7)
    assert env.occurred_at == datetime(2026, 11, 20, 10, tzinfo=UTC)
    assert env.event_time == env.occurred_at
    assert env.timestamp == datetime.fromtimestamp(1_700_000_000, tz=UTC)
    assert env.correlation_id == "c-9"
    assert env.traceparent == "00-abc-def-01"
    assert (env.aggregate_type, env.causation_id) == ("order", "c-8")
    assert env.headers == dict(headers)


def test_each_record_of_a_decoder_gets_its_own_time() -> None:
    decoder = Decoder(ROUTES, WireFormat(), 1000)
    times = []
    for millis in (1_000, 1_000, 2_000, None, 2_000):
        times.append(decoder.decode(record(timestamp=millis)).envelope.timestamp)
    with pytest.raises(DecodeError):
        decoder.decode(record(timestamp=2**63 - 1))
    times.append(decoder.decode(record(timestamp=253_402_300_799_000)).envelope.timestamp)
    times.append(decoder.decode(record(timestamp=2_000)).envelope.timestamp)
    assert times == [record_time(m) for m in (1_000, 1_000, 2_000, None, 2_000,
                                               253_402_300_799_000, 2_000)]


def test_a_decoder_that_saw_many_record_times_still_gives_each_record_its_own() -> None:
    decoder = Decoder(ROUTES, WireFormat(), 1000)
    millis = [1_700_000_000_000 + n * 7 for n in range(5_000)] + [1_700_000_000_000]
    times = [decoder.decode(record(timestamp=m)).envelope.timestamp for m in millis]
    assert times == [record_time(m) for m in millis]


@pytest.mark.parametrize("present", [
    "occurred_at", "aggregate_type", "correlation_id", "causation_id", "traceparent"])
def test_each_optional_header_is_read_alone(present: str) -> None:
    values = {"occurred_at": b"2026-11-20T10:00:00Z", "aggregate_type": b"order",
              "correlation_id": b"c-9", "causation_id": b"c-8", "traceparent": b"00-a-b-01"}
    headers = [("id", b"evt-1"), ("event_type", b"order.created"), (present, values[present])]
    env = Decoder(ROUTES, WireFormat(), 1000).decode(record(headers=headers)).envelope
    found = {name: getattr(env, name) for name in values}
    assert {name for name, value in found.items() if value is not None} == {present}
    bare = Decoder(ROUTES, WireFormat(), 1000).decode(record()).envelope
    assert all(getattr(bare, name) is None for name in values)


def test_an_optional_header_named_as_the_id_header_reads_the_id() -> None:
    wire = WireFormat(correlation_id_header="id")
    env = Decoder(ROUTES, wire, 1000).decode(record()).envelope
    assert (env.event_id, env.correlation_id) == ("evt-1", "evt-1")


@pytest.mark.parametrize(("rec", "expected"), [
    (record(value=b"{not json"), "invalid_json"),
    (record(value=b'{"order_id": "o-1"}'), "invalid_payload"),
    (record(value=b'{"order_id": "o-1", "amount": "many"}'), "invalid_payload"),
    (record(headers=[("event_type", b"order.created")]), "missing_event_id"),
    (record(headers=[("id", b"e")]), "missing_event_type"),
    (record(headers=[("id", b"e"), ("event_type", b"order.shipped")]), "unknown_event_type"),
    (record(value=None), "empty_value"),
    (record(key=b"\xff\xfe"), "invalid_key"),
    (record(headers=[("id", b"e"), ("event_type", b"order.created"),
                     ("occurred_at", b"yesterday")]), "invalid_header"),
    (record(headers=[("id", b"\xff"), ("event_type", b"order.created")]), "invalid_header"),
    (record(headers=[("id", b"x" * 201), ("event_type", b"order.created")]),
     "invalid_event_id"),
    (record(timestamp=253_402_300_800_000), "invalid_timestamp"),  # 10000-01-01
    (record(timestamp=2**63 - 1), "invalid_timestamp"),  # the largest Kafka timestamp
])
def test_bad_input_has_a_reason(rec: Record, expected: str) -> None:
    assert reason(rec) == expected


def test_oversized_values_are_refused_before_parsing() -> None:
    assert reason(record(value=b"x" * 1001)) == "oversized"


def test_id_fallback_chain_payload_then_position() -> None:
    no_id = [("event_type", b"order.created")]
    by_field = Decoder(ROUTES, WireFormat(id_payload_field="order_id"), 1000)
    env = by_field.decode(record(headers=no_id)).envelope
    assert (env.event_id, env.id_source) == ("o-1", "payload")
    by_position = Decoder(ROUTES, WireFormat(id_from_position=True), 1000)
    env = by_position.decode(record(headers=no_id)).envelope
    assert (env.event_id, env.id_source) == ("orders/2/7", "position")
    header_wins = by_field.decode(record()).envelope
    assert header_wins.id_source == "header"


def test_header_names_are_configurable() -> None:
    wire = WireFormat(id_header="ce_id", event_type_header="ce_type")
    rec = record(headers=[("ce_id", b"abc"), ("ce_type", b"order.created")])
    env = Decoder(ROUTES, wire, 1000).decode(rec).envelope
    assert (env.event_id, env.event_type) == ("abc", "order.created")


def test_topic_route_needs_no_event_type() -> None:
    @handler(topic="legacy")
    async def legacy(event: OrderCreated, ctx: HandlerContext) -> None:
        del event, ctx

    rec = Record("legacy", 0, 1, None, GOOD, [("id", b"e-1")])
    decoded = Decoder(RouteTable.build([legacy]), WireFormat(), 1000).decode(rec)
    assert decoded.route.func is legacy
    assert decoded.envelope.key is None


class Picky(BaseModel):
    order_id: str

    @field_validator("order_id")
    @classmethod
    def known(cls, value: str) -> str:
        return {"o-1": value}[value]  # KeyError for anything else: not a ValueError


@handler("picky")
async def picky(event: Picky, ctx: HandlerContext) -> None:
    del event, ctx


def test_a_validator_raising_any_exception_is_an_invalid_payload() -> None:
    decoder = Decoder(RouteTable.build([picky]), WireFormat(), 1000)
    rec = record(value=b'{"order_id": "o-2"}', headers=[("id", b"e"), ("event_type", b"picky")])
    with pytest.raises(DecodeError) as info:
        decoder.decode(rec)
    assert info.value.reason == "invalid_payload"
    assert "KeyError" in info.value.detail


@pytest.mark.parametrize(("millis", "expected"), [
    (0, datetime(1970, 1, 1, tzinfo=UTC)),
    (1_700_000_000_123, datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=UTC)),  # exact ms
    (253_402_300_799_999, datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)),
    (-1, None),  # Kafka's "no timestamp"
    (-1_000, None),
    (None, None),
])
def test_record_time(millis: int | None, expected: datetime | None) -> None:
    assert record_time(millis) == expected


@pytest.mark.parametrize("millis", [None, -1])
def test_a_record_without_a_time_decodes_with_no_event_time(millis: int | None) -> None:
    env = Decoder(ROUTES, WireFormat(), 1000).decode(record(timestamp=millis)).envelope
    assert (env.timestamp, env.event_time) == (None, None)


def test_occurred_at_is_the_event_time_even_without_a_record_time() -> None:
    headers: list[tuple[str, bytes | None]] = [
        ("id", b"evt-1"), ("event_type", b"order.created"),
        ("occurred_at", b"2026-11-20T10:00:00+01:00")]
    env = Decoder(ROUTES, WireFormat(), 1000).decode(record(headers=headers, timestamp=-1)).envelope
    assert env.timestamp is None
    assert env.event_time == datetime(2026, 11, 20, 9, tzinfo=UTC)


def test_null_header_values_are_ignored() -> None:
    headers: list[tuple[str, bytes | None]] = [
        ("id", b"evt-1"), ("event_type", b"order.created"), ("correlation_id", None),
        ("trace", None)]
    env = Decoder(ROUTES, WireFormat(), 1000).decode(record(headers=headers)).envelope
    assert env.correlation_id is None
    assert "trace" not in env.headers


def test_a_repeated_header_keeps_its_last_value_that_is_not_null() -> None:
    headers: list[tuple[str, bytes | None]] = [
        ("id", b"evt-1"), ("event_type", b"order.created"), ("id", None),
        ("correlation_id", b"c-1"), ("correlation_id", b"c-2")]
    env = Decoder(ROUTES, WireFormat(), 1000).decode(record(headers=headers)).envelope
    assert (env.event_id, env.correlation_id) == ("evt-1", "c-2")
    assert env.headers == {"id": b"evt-1", "event_type": b"order.created",
                           "correlation_id": b"c-2"}
