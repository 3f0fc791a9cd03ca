"""Event versions and upcasters, through the one decoder: the worked example of
docs/event-versions.md (examples/event_versions.py) takes versions 1, 2 and 3; a gap in a chain
is refused when routes are built; a newer version or a failing upcaster is a reason code."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar
from uuid import UUID

import orjson
import pytest
from pydantic import BaseModel, ConfigDict

from consumerkit import (
    Consumer,
    DecodeError,
    HandlerContext,
    HandlerDefinitionError,
    HandlerRegistry,
    Record,
    UpcasterChainError,
    WireFormat,
    handler,
    upcaster,
)
from consumerkit.cli import main
from consumerkit.engine.decode import Decoder
from consumerkit.route_table import RouteTable
from examples.event_versions import OrderCreated, orders

V1 = {"order_id": "o-1", "amount": 1250, "customer": "Ada Lovelace"}
V2 = {"order_id": "o-1", "total_cents": 1250, "customer": "Ada Lovelace"}
V3 = {"order_id": "o-1", "total_cents": 1250, "first_name": "Ada", "last_name": "Lovelace"}


def record(doc: object, version: bytes | None) -> Record:
    headers = [("id", b"evt-1"), ("event_type", b"order.created")]
    if version is not None:
        headers.append(("event_version", version))
    return Record("orders", 0, 3, b"o-1", orjson.dumps(doc), headers)


def decode(rec: Record, routes: RouteTable | None = None) -> BaseModel:
    return Decoder(routes or RouteTable.build([orders]), WireFormat(), 10_000).decode(rec).event


def reason(rec: Record, routes: RouteTable | None = None) -> tuple[str, str]:
    with pytest.raises(DecodeError) as info:
        decode(rec, routes)
    return info.value.reason, info.value.detail


@pytest.mark.parametrize(("doc", "version"), [(V1, None), (V1, b"1"), (V2, b"2"), (V3, b"3")])
def test_every_version_reaches_the_handler_as_version_3(doc: object, version: bytes) -> None:
    assert decode(record(doc, version)) == OrderCreated.model_validate(V3)


def test_the_handler_takes_the_models_version_and_the_chain_is_built() -> None:
    routes = RouteTable.build([orders])
    assert routes.by_type["order.created"].version == 3
    assert len(routes.chains["order.created"].steps) == 2


def test_a_newer_version_is_a_reason_not_a_validation_error() -> None:
    assert reason(record(V3, b"4")) == (
        "unknown_version",
        "event version 4 of 'order.created' is newer than its handler takes (3)")


@pytest.mark.parametrize("raw", [b"0", b"two", b"-1", b"\xb2", b"99999999999"])
def test_a_broken_version_header_is_invalid_header(raw: bytes) -> None:
    assert reason(record(V3, raw))[0] == "invalid_header"


def test_a_failing_upcaster_and_a_non_object_are_upcast_failed() -> None:
    code, detail = reason(record({"order_id": "o-1"}, b"1"))  # no "amount" to rename
    assert code == "upcast_failed"
    assert "upcaster of 'order.created' from version 1: KeyError" in detail
    assert reason(record([1, 2], b"1"))[0] == "upcast_failed"


def test_an_upcast_document_that_does_not_fit_is_invalid_payload() -> None:
    code, detail = reason(record({**V1, "amount": "lots"}, b"1"))
    assert (code, detail) == ("invalid_payload", "total_cents: Input should be a valid "
                                                 "integer, unable to parse string as an integer")


class Shipped(BaseModel):
    __event_version__: ClassVar[int] = 4
    order_id: str


@handler("order.shipped")
async def ship(event: Shipped, ctx: HandlerContext) -> None:
    del event, ctx


@upcaster("order.shipped", from_version=1)
def ship_1(doc: dict[str, Any]) -> dict[str, Any]:
    return doc


@upcaster("order.shipped", from_version=3)
def ship_3(doc: dict[str, Any]) -> dict[str, Any]:
    return doc


def test_a_gap_in_the_chain_is_a_startup_error_naming_it() -> None:
    with pytest.raises(UpcasterChainError, match=r"'order.shipped' \(handler takes version 4\) "
                                                 r"has no upcaster from version 2"):
        Consumer(name="gap", handlers=[ship, ship_1, ship_3], topics=["orders"])
    registry = HandlerRegistry([ship, ship_1, ship_3]).include(
        upcaster("order.shipped", from_version=2)(lambda doc: doc))
    assert len(RouteTable.build([registry]).chains["order.shipped"].steps) == 3


def gapped() -> Consumer:
    """A consumer whose chain has a gap, for the command line below."""
    return Consumer(name="gap", handlers=[ship, ship_1, ship_3], topics=["orders"])


def test_a_gap_stops_a_command_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["asyncapi", "tests.unit.test_versions:gapped"]) == 1
    assert capsys.readouterr().err == (
        "consumerkit: upcaster chain: 'order.shipped' (handler takes version 4) has no "
        "upcaster from version 2\n")


def test_stray_doubled_and_useless_upcasters_are_named() -> None:
    def again() -> Any:
        return lambda doc: doc  # a new function each time: @upcaster marks the function

    cases = [
        ([ship, ship_1, upcaster("order.shipped", from_version=1)(again())],
         "two upcasters of 'order.shipped' from version 1"),
        ([ship, upcaster("order.lost", from_version=1)(again())],
         "upcasters of 'order.lost', which has no handler"),
        ([orders, upcaster("order.created", from_version=3)(again())],
         "'order.created' has an upcaster from version 3, but its handler takes version 3"),
    ]
    for sources, message in cases:
        with pytest.raises(UpcasterChainError, match=message):
            RouteTable.build(sources)


def test_a_registry_handler_declares_its_version() -> None:
    registry = HandlerRegistry()

    @registry.handler("order.created", version=2)
    async def take(event: OrderCreatedV2, ctx: HandlerContext) -> None:
        del event, ctx

    @registry.upcaster("order.created", from_version=1)
    def rename(doc: dict[str, Any]) -> dict[str, Any]:
        return {"order_id": doc["order_id"], "total_cents": doc["amount"]}

    routes = RouteTable.build([registry])
    assert routes.by_type["order.created"].version == 2
    assert decode(record(V1, None), routes) == OrderCreatedV2(order_id="o-1", total_cents=1250)


class OrderCreatedV2(BaseModel):
    order_id: str
    total_cents: int


def test_definitions_are_checked_where_they_are_written() -> None:
    with pytest.raises(HandlerDefinitionError, match="version must be an integer from 1"):
        handler("x", version=0)
    async def later(doc: dict[str, Any]) -> dict[str, Any]:
        return doc

    with pytest.raises(HandlerDefinitionError, match="must be a plain function"):
        upcaster("x", from_version=1)(later)  # type: ignore[type-var]

    @handler("order.shipped", version=2)
    async def disagrees(event: Shipped, ctx: HandlerContext) -> None:
        del event, ctx

    with pytest.raises(HandlerDefinitionError, match="takes version 2, but its model Shipped "
                                                     "declares version 4"):
        RouteTable.build([disagrees])



class Paid(BaseModel):
    model_config = ConfigDict(strict=True)
    __event_version__: ClassVar[int] = 2
    payment_id: UUID
    paid_at: datetime


@handler("payment.made")
async def paid(event: Paid, ctx: HandlerContext) -> None:
    del event, ctx


@upcaster("payment.made", from_version=1)
def paid_1(doc: dict[str, Any]) -> dict[str, Any]:
    return {"payment_id": doc["id"], "paid_at": doc["at"]}


def test_an_upcast_document_is_validated_as_json_like_a_current_one() -> None:
    """A strict model takes a timestamp or a UUID as a JSON string; an upcast document is
    validated in the same (JSON) mode, so version 1 passes where version 2 passes."""
    routes = RouteTable.build([paid, paid_1])
    at, pid = "2026-11-26T10:00:00+00:00", "0193b1c2-7d4e-7c3a-9f00-000000000001"
    headers = [("id", b"evt-9"), ("event_type", b"payment.made")]
    current = Record("payments", 0, 1, b"p", orjson.dumps({"payment_id": pid, "paid_at": at}),
                     [*headers, ("event_version", b"2")])
    old = Record("payments", 0, 2, b"p", orjson.dumps({"id": pid, "at": at}), headers)
    assert decode(old, routes) == decode(current, routes)


class Tagged(BaseModel):
    __event_version__: ClassVar[int] = 2
    tags: list[str]


@handler("item.tagged")
async def tagged(event: Tagged, ctx: HandlerContext) -> None:
    del event, ctx


@upcaster("item.tagged", from_version=1)
def tagged_1(doc: dict[str, Any]) -> dict[str, Any]:
    return {"tags": set(doc["tags"])}  # a set: no JSON


def test_an_upcast_document_json_cannot_hold_is_upcast_failed() -> None:
    rec = Record("items", 0, 1, b"i", orjson.dumps({"tags": ["a"]}),
                 [("id", b"evt-7"), ("event_type", b"item.tagged")])
    code, detail = reason(rec, RouteTable.build([tagged, tagged_1]))
    assert code == "upcast_failed"
    assert detail.startswith("the upcasters of 'item.tagged' returned what JSON cannot hold: ")
