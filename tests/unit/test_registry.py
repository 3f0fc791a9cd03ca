import pytest
from pydantic import BaseModel

from consumerkit import HandlerContext, HandlerDefinitionError, HandlerRegistry, handler
from consumerkit.registry import resolve
from consumerkit.route_table import RouteTable

from . import handlers_future


class Paid(BaseModel):
    order_id: str


@handler("order.paid")
async def on_paid(event: Paid, ctx: HandlerContext) -> None:
    del event, ctx


@handler(topic="legacy-orders")
async def on_legacy(event: Paid, ctx: HandlerContext) -> None:
    del event, ctx


def test_decorator_returns_the_function_unchanged() -> None:
    async def raw(event: Paid, ctx: HandlerContext) -> None:
        del event, ctx

    assert handler("x")(raw) is raw
    assert resolve(raw).model is Paid
    assert resolve(raw).event_type == "x"


def test_postponed_annotations_are_resolved() -> None:
    route = resolve(handlers_future.charge)
    assert route.model is handlers_future.OrderCreated


def test_unresolvable_annotation_is_a_clear_error() -> None:
    with pytest.raises(HandlerDefinitionError, match="cannot resolve the annotations"):
        RouteTable.build([handlers_future.cancel])


def test_sync_handler_is_rejected() -> None:
    def sync(event: Paid, ctx: HandlerContext) -> None:
        del event, ctx

    with pytest.raises(HandlerDefinitionError, match="async def"):
        handler("x")(sync)  # type: ignore[type-var]


def test_payload_must_be_a_pydantic_model() -> None:
    @handler("x")
    async def bad(event: dict[str, int], ctx: HandlerContext) -> None:
        del event, ctx

    with pytest.raises(HandlerDefinitionError, match="pydantic model"):
        RouteTable.build([bad])


def test_duplicate_event_types_are_rejected() -> None:
    @handler("order.paid")
    async def twice(event: Paid, ctx: HandlerContext) -> None:
        del event, ctx

    with pytest.raises(HandlerDefinitionError, match=r"two handlers for 'order\.paid'"):
        RouteTable.build([on_paid, twice])


def test_undecorated_function_is_rejected() -> None:
    async def plain(event: Paid, ctx: HandlerContext) -> None:
        del event, ctx

    with pytest.raises(HandlerDefinitionError, match="not a handler"):
        HandlerRegistry([plain])


def test_registries_include_functions_modules_and_registries() -> None:
    billing = HandlerRegistry([on_paid])
    legacy = HandlerRegistry().include(on_legacy)
    everything = HandlerRegistry([billing, legacy])
    assert len(everything) == 2
    table = RouteTable.build([everything])
    found = table.find("order.paid", "orders")
    assert found is not None
    assert found.func is on_paid
    by_topic = table.find(None, "legacy-orders")
    assert by_topic is not None
    assert by_topic.func is on_legacy
    assert table.find("nope", "orders") is None


def test_registry_handler_decorator_and_freeze() -> None:
    registry = HandlerRegistry()

    @registry.handler("a")
    async def first(event: Paid, ctx: HandlerContext) -> None:
        del event, ctx

    assert len(registry) == 1
    RouteTable.build([registry])  # a consumer using the registry freezes it
    with pytest.raises(HandlerDefinitionError, match="frozen"):
        registry.include(on_paid)


def test_module_without_handlers_is_rejected() -> None:
    import json

    with pytest.raises(HandlerDefinitionError, match="defines no handlers"):
        HandlerRegistry([json])


def test_handler_needs_a_key() -> None:
    with pytest.raises(HandlerDefinitionError):
        handler()
    with pytest.raises(HandlerDefinitionError):
        handler("")
