"""Batch handlers without a database: how ``@handler(..., batch=True)`` is declared and
resolved, and the order of the handler calls of one transaction (each key keeps its order)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from consumerkit import (
    BatchContext,
    HandlerContext,
    HandlerDefinitionError,
    HandlerRegistry,
    handler,
)
from consumerkit.engine.decode import Decoded
from consumerkit.engine.plan import plan
from consumerkit.envelope import Envelope
from consumerkit.registry import Route, resolve
from consumerkit.route_table import RouteTable


class Added(BaseModel):
    n: int


class Removed(BaseModel):
    n: int


@handler("line.added", batch=True)
async def add_lines(events: list[Added], ctx: BatchContext) -> None:
    del events, ctx


@handler("line.removed")
async def remove_line(event: Removed, ctx: HandlerContext) -> None:
    del event, ctx


@handler("line.moved", batch=True)
async def move_lines(events: list[Removed], ctx: BatchContext) -> None:
    del events, ctx


def test_a_batch_handler_resolves_the_model_of_its_list() -> None:
    route = resolve(add_lines)
    assert (route.model, route.batch, route.event_type) == (Added, True, "line.added")
    assert resolve(remove_line).batch is False


def test_a_batch_handler_needs_a_list_of_one_model() -> None:
    async def single(event: Added, ctx: BatchContext) -> None:
        del event, ctx

    async def untyped(events: list, ctx: BatchContext) -> None:  # type: ignore[type-arg]
        del events, ctx

    async def of_ints(events: list[int], ctx: BatchContext) -> None:
        del events, ctx

    for func in (single, untyped, of_ints):
        with pytest.raises(HandlerDefinitionError, match=r"batch handler .* list\[Model\]"):
            resolve(handler("x", batch=True)(func))


def test_a_list_without_batch_says_how_to_declare_a_batch_handler() -> None:
    async def listed(events: list[Added], ctx: HandlerContext) -> None:
        del events, ctx

    with pytest.raises(HandlerDefinitionError, match=r"batch=True"):
        resolve(handler("x")(listed))


def test_the_registry_decorator_takes_batch() -> None:
    registry = HandlerRegistry()

    @registry.handler("line.archived", batch=True)
    async def archive(events: list[Added], ctx: BatchContext) -> None:
        del events, ctx

    table = RouteTable.build([registry])
    assert table.by_type["line.archived"].batch is True


_ROUTES = RouteTable.build([add_lines, remove_line, move_lines]).by_type
_offsets = iter(range(1_000_000))


def item(key: str, event_type: str, partition: int = 0) -> Decoded:
    offset = next(_offsets)
    env = Envelope(f"{key}-{offset}", "header", event_type, key, "t", partition, offset, None)
    route: Route = _ROUTES[event_type]
    return Decoded(env, route, route.model(n=offset))


def shape(calls: list[tuple[Route, list[Decoded]]]) -> list[tuple[str, list[str]]]:
    return [(route.event_type or "", [d.envelope.event_id for d in records])
            for route, records in calls]


def test_one_call_for_every_record_of_a_batch_handler() -> None:
    items = [item("a", "line.added"), item("a", "line.added"), item("b", "line.added")]
    assert shape(plan(items)) == [("line.added", [d.envelope.event_id for d in items])]


def test_per_record_handlers_run_in_turn_as_before() -> None:
    items = [item("a", "line.removed"), item("b", "line.removed"), item("a", "line.removed")]
    assert [ids for _, ids in shape(plan(items))] == [[d.envelope.event_id] for d in items]


def test_a_key_mixing_types_splits_the_batch_call_to_keep_its_order() -> None:
    a1, b1 = item("a", "line.added"), item("b", "line.added")
    a2, a3 = item("a", "line.removed"), item("a", "line.added")
    b2 = item("b", "line.added")  # joins the latest call of its handler: b is in no later one
    c1, c2 = item("c", "line.moved"), item("c", "line.added")  # c2 may not pass c1
    assert [[d.envelope.event_id for d in group] for _, group in plan(
        [a1, b1, a2, a3, b2, c1, c2])] == [[d.envelope.event_id for d in group] for group in (
            [a1, b1], [a2], [a3, b2], [c1], [c2])]


def test_the_same_key_on_two_partitions_is_two_keys() -> None:
    a0, moved, a1 = item("a", "line.added"), item("a", "line.moved", 1), item("a", "line.added")
    # partition 1's key "a" is another lane: a1 (partition 0) may join a0's call
    assert shape(plan([a0, moved, a1]))[0][1] == [a0.envelope.event_id, a1.envelope.event_id]
