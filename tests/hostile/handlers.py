"""The handlers every hostile test routes to: an item written to a table whose constraints
a payload can violate (a CHECK, a NUL byte, an integer out of range), and a version-2 event
with an upcaster, so that versions have somewhere to go."""

from __future__ import annotations

from typing import Any

import asyncpg
from pydantic import BaseModel

from consumerkit import HandlerContext, HandlerRegistry

registry = HandlerRegistry()


class Item(BaseModel):
    id: str
    n: int


class Moved(BaseModel):
    __event_version__ = 2
    id: str
    n: int
    place: str


@registry.handler("item.saved")
async def save_item(event: Item, ctx: HandlerContext) -> None:
    await ctx.tx.execute("INSERT INTO items (event_id, id, n) VALUES ($1, $2, $3)",
                         ctx.envelope.event_id, event.id, event.n)


@registry.handler("item.moved")
async def move_item(event: Moved, ctx: HandlerContext) -> None:
    await ctx.tx.execute("INSERT INTO items (event_id, id, n) VALUES ($1, $2, $3)",
                         ctx.envelope.event_id, event.id, event.n)


@registry.upcaster("item.moved", from_version=1)
def place_unknown(doc: dict[str, Any]) -> dict[str, Any]:
    return {**doc, "place": doc.pop("where")}  # a KeyError for a document without it


EVENT_TYPES = ("item.saved", "item.moved")
ITEMS_SQL = ('CREATE TABLE "{schema}".items (seq bigserial PRIMARY KEY, '
             "event_id text NOT NULL, id text NOT NULL, n int NOT NULL CHECK (n >= 0))")


async def create_items(pool: asyncpg.Pool[asyncpg.Record], schema: str) -> None:
    await pool.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    await pool.execute(ITEMS_SQL.format(schema=schema))


async def items_by_event(pool: asyncpg.Pool[asyncpg.Record], schema: str) -> dict[str, int]:
    rows = await pool.fetch(
        f'SELECT event_id, count(*) AS n FROM "{schema}".items GROUP BY event_id')
    return {row["event_id"]: row["n"] for row in rows}
