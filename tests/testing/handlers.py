"""Handlers for the test kit's own tests: effects in a table of the test's schema."""

from __future__ import annotations

import asyncpg
from pydantic import BaseModel

from consumerkit import DeadLetter, HandlerContext, HandlerRegistry

registry = HandlerRegistry()

TABLE_SQL = ("CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL, "
             "seq int NOT NULL, note text NOT NULL DEFAULT '')")


class Step(BaseModel):
    key: str
    seq: int
    fail: str = ""  # "error": raise; "dead": DeadLetter; "once": fail only on attempt 1


class Unhandled(BaseModel):
    x: int


@registry.handler("step.done")
async def apply_step(event: Step, ctx: HandlerContext) -> None:
    await ctx.tx.execute("INSERT INTO effects (key, seq) VALUES ($1, $2)", event.key, event.seq)
    if event.fail == "error" or (event.fail == "once" and ctx.attempt == 1):
        raise ValueError(f"step {event.seq} of {event.key} failed")
    if event.fail == "dead":
        raise DeadLetter("refused by the handler")


async def effects(dsn: str) -> list[tuple[str, int]]:
    """The effects table's (key, seq) rows, in the order they were written."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT key, seq FROM effects ORDER BY id")
    finally:
        await conn.close()
    return [(r["key"], r["seq"]) for r in rows]
