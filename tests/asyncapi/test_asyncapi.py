"""``consumerkit asyncapi``: the documents of the pizza shop and of the examples pass the
AsyncAPI project's own parser, a broken document does not, and the document on the docs site
(examples/pizza_shop_asyncapi.json, quoted by docs/asyncapi.md) is the one the code makes."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, handler
from consumerkit.asyncapi import document
from consumerkit.catalog import EventCatalog, Receives, Sends
from consumerkit.cli import main
from consumerkit.errors import ConfigurationError
from consumerkit.publishes import Publishes
from examples.event_versions import OrderCreated, orders

from .parser import AsyncApiParser

ROOT = Path(__file__).resolve().parents[2]


class Accepted(BaseModel):
    order_id: str

PIZZA = ROOT / "examples" / "pizza_shop_asyncapi.json"


def write(tmp_path: Path, doc: dict[str, Any], name: str = "doc.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc, indent=2))
    return path


def examples_catalog() -> EventCatalog:
    """Every example module with handlers as a service consuming a topic of its own, and the
    versioned example's event sent through an outbox."""
    names = [p.stem for p in sorted((ROOT / "examples").glob("*.py"))
             if re.search(r"^@(\w+\.)?handler\(", p.read_text(), re.MULTILINE)]
    assert "event_versions" in names
    return EventCatalog(
        title="consumerkit examples",
        receives=[Receives(n, [f"examples.{n}"], [importlib.import_module(f"examples.{n}")])
                  for n in names],
        sends=[Sends("orders", "order.created", OrderCreated, "order", "examples.event_versions")])


def test_the_pizza_shop_document_is_valid_and_is_the_one_the_docs_show(
    tmp_path: Path, asyncapi_parser: AsyncApiParser, capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "pizza.json"
    assert main(["asyncapi", "consumerkit.demo.catalog:catalog", "--output", str(out)]) == 0
    assert out.read_text() == PIZZA.read_text(), (
        "regenerate: consumerkit asyncapi consumerkit.demo.catalog:catalog "
        "-o examples/pizza_shop_asyncapi.json")
    verdict = asyncapi_parser.validate(out)
    assert (verdict.exit_code, verdict.errors) == (0, [])
    doc = json.loads(out.read_text())
    assert doc["asyncapi"] == "3.0.0"
    assert {c["address"] for c in doc["channels"].values()} == {
        "pizza-orders-{run}", "pizza-payments-{run}"}
    assert set(doc["operations"]) == {
        "billing.receive.pizza-orders-run", "inventory.receive.pizza-orders-run",
        "shop.receive.pizza-payments-run", "shop.send.pizza-orders-run",
        "billing.send.pizza-payments-run"}
    placed = doc["components"]["messages"]["order.placed.v1"]
    assert placed["payload"] == {"$ref": "#/components/schemas/OrderPlaced"}
    assert placed["headers"]["properties"]["event_type"]["const"] == "order.placed"
    assert doc["components"]["schemas"]["OrderPlaced"]["required"] == [
        "order_id", "seq", "pizza", "price"]
    assert main(["asyncapi", "consumerkit.demo.catalog:catalog"]) == 0
    assert json.loads(capsys.readouterr().out) == doc


def test_the_examples_document_is_valid_with_every_version(
    tmp_path: Path, asyncapi_parser: AsyncApiParser,
) -> None:
    doc = document(examples_catalog())
    verdict = asyncapi_parser.validate(write(tmp_path, doc))
    assert (verdict.exit_code, verdict.errors) == (0, [])
    messages = doc["components"]["messages"]
    channel = doc["channels"]["examples.event_versions"]["messages"]
    versions = {messages[name]["title"] for name in channel}
    assert versions == {f"order.created version {v}" for v in (1, 2, 3)}
    v3 = next(m for m in messages.values() if m["title"] == "order.created version 3")
    assert v3["headers"]["required"] == ["id", "event_type", "event_version"]
    assert v3["headers"]["properties"]["event_version"]["const"] == "3"
    v1 = next(m for n, m in messages.items() if n in channel and m["title"].endswith(" 1"))
    assert "rename_amount, split_customer carry it to version 3" in (
        v1["payload"]["description"])
    sent = doc["operations"]["orders.send.examples.event_versions"]["messages"]
    assert sent == [{"$ref": f"#/channels/examples.event_versions/messages/{n}"}
                    for n in channel if messages[n] is v3]


def test_the_parser_refuses_a_broken_document(
    tmp_path: Path, asyncapi_parser: AsyncApiParser,
) -> None:
    doc = document(EventCatalog("orders", receives=[Receives("orders", ["orders"], [orders])]))
    del doc["info"]["version"]
    op = next(iter(doc["operations"].values()))
    op["channel"] = {"$ref": "#/channels/nowhere"}
    verdict = asyncapi_parser.validate(write(tmp_path, doc))
    assert verdict.exit_code == 1
    paths = {e["path"] for e in verdict.errors}
    assert "info" in paths
    assert any("nowhere" in e["message"] or "channel" in e["path"] for e in verdict.errors)


def test_a_consumer_is_a_catalog_of_what_it_receives(
    tmp_path: Path, asyncapi_parser: AsyncApiParser,
) -> None:
    consumer = Consumer(name="orders", handlers=[orders], topics=["orders", "returns"])
    doc = document(EventCatalog.of(consumer))
    assert set(doc["channels"]) == {"orders", "returns"}
    verdict = asyncapi_parser.validate(write(tmp_path, doc))
    assert (verdict.exit_code, verdict.errors) == (0, [])


def test_mistakes_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["asyncapi", "examples.event_versions:orders"]) == 1
    assert capsys.readouterr().err == (
        "consumerkit: examples.event_versions:orders is a HandlerRegistry, not an "
        "EventCatalog, a Consumer, nor a function returning one\n")
    assert main(["asyncapi", "examples.event_versions:record_order"]) == 1
    assert capsys.readouterr().err == (  # named as what it is, never called
        "consumerkit: examples.event_versions:record_order is a handler (of event type "
        "'order.created'), not an EventCatalog, a Consumer, nor a function returning one\n")
    assert main(["asyncapi", "examples.event_versions:rename_amount"]) == 1
    assert capsys.readouterr().err == (
        "consumerkit: examples.event_versions:rename_amount is a function that needs "
        "arguments (doc), not an EventCatalog, a Consumer, nor a function returning one\n")
    with pytest.raises(ConfigurationError, match="a parameter is written"):
        EventCatalog("x", sends=[Sends("s", "e", OrderCreated, "a", "orders-{0:>3}")])
    with pytest.raises(ConfigurationError, match="invalid topic name 'orders created'"):
        EventCatalog("x", receives=[Receives("billing", ["orders created"], [orders])])
    with pytest.raises(ConfigurationError, match="invalid topic name 'order placed'"):
        EventCatalog("x", sends=[Sends("s", "e", OrderCreated, "order placed")])
    EventCatalog("x", receives=[Receives("billing", ["orders-{region}"], [orders])])
    with pytest.raises(ConfigurationError, match="receives and sends nothing"):
        EventCatalog("x")


def test_a_consumer_s_document_holds_the_sends_its_handlers_declare(
    tmp_path: Path, asyncapi_parser: AsyncApiParser,
) -> None:
    @handler("order.placed", publishes=[Publishes("order.accepted", Accepted, "order")])
    async def accept(event: Accepted, ctx: HandlerContext) -> None: ...

    doc = document(EventCatalog.of(Consumer(name="orders", handlers=[accept],
                                            topics=["orders-in"])))
    verdict = asyncapi_parser.validate(write(tmp_path, doc))
    assert (verdict.exit_code, verdict.errors) == (0, [])
    assert set(doc["operations"]) == {"orders.receive.orders-in", "orders.send.order"}
    assert {c["address"] for c in doc["channels"].values()} == {"orders-in", "order"}
