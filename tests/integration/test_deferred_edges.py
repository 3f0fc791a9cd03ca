"""Deferred writes at the edges of ``ctx.tx``: savepoints driven by hand, prepared statements'
cursors, writes without arguments amid a run, and the methods' signatures. On a real
PostgreSQL, with the transaction's queue as the engine makes it."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
import pytest

from consumerkit import Envelope, HandlerContext
from consumerkit.shared.deferred import Deferred
from consumerkit.shared.identifiers import identifier
from consumerkit.types import DbConnection


@dataclass
class Tx:
    conn: DbConnection
    ctx: HandlerContext
    deferred: Deferred
    insert: str
    select: str

    async def notes(self) -> list[str]:
        return [r["note"] for r in await self.conn.fetch(self.select)]


@pytest.fixture
async def tx(pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str) -> AsyncIterator[Tx]:
    s = identifier(pg_schema)
    async with pg_pool.acquire() as conn:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        await conn.execute(f"CREATE TABLE {s}.notes (id bigserial PRIMARY KEY, note text)")
        async with conn.transaction():
            deferred = Deferred(conn)
            envelope = Envelope("evt-1", "header", "note.taken", "k", "t", 0, 0,
                                datetime.now(UTC))
            yield Tx(conn, HandlerContext(conn, envelope, 1, deferred=deferred), deferred,
                     f"INSERT INTO {s}.notes (note) VALUES ($1)",
                     f"SELECT note FROM {s}.notes ORDER BY id")


async def test_a_savepoint_rolled_back_by_hand_drops_what_was_queued_inside_it(tx: Tx) -> None:
    tx.ctx.defer(tx.insert, "before")
    savepoint = tx.ctx.tx.transaction()
    await savepoint.start()
    tx.ctx.defer(tx.insert, "inside")
    await savepoint.rollback()
    tx.ctx.defer(tx.insert, "after")
    await tx.deferred.flush()
    assert await tx.notes() == ["before", "after"]


async def test_a_savepoint_committed_by_hand_sends_what_was_queued_inside_it(tx: Tx) -> None:
    savepoint = tx.ctx.tx.transaction()
    await savepoint.start()
    tx.ctx.defer(tx.insert, "inside")
    await savepoint.commit()
    assert not tx.deferred.queue
    assert await tx.notes() == ["inside"]


async def test_a_prepared_statements_cursor_reads_the_writes_queued_before_it(tx: Tx) -> None:
    statement = await tx.ctx.tx.prepare(tx.select)
    tx.ctx.defer(tx.insert, "mine")
    assert [r["note"] async for r in statement.cursor()] == ["mine"]
    tx.ctx.defer(tx.insert, "again")
    assert await statement.fetchval() == "mine"
    assert await tx.notes() == ["mine", "again"]


async def test_a_write_without_arguments_keeps_its_place_in_a_run(tx: Tx) -> None:
    bare = tx.insert.replace("$1", "'bare'")
    for note in ("one", "two"):
        tx.ctx.defer(tx.insert, note)
    tx.ctx.defer(bare)
    tx.ctx.defer(bare)
    tx.ctx.defer(tx.insert, "three")
    await tx.deferred.flush()
    assert await tx.notes() == ["one", "two", "bare", "bare", "three"]


async def test_ctx_tx_keeps_the_connections_signatures(tx: Tx) -> None:
    for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval", "prepare",
                 "cursor", "transaction", "copy_records_to_table"):
        assert inspect.signature(getattr(tx.ctx.tx, name)) == inspect.signature(
            getattr(tx.conn, name)), name
    assert isinstance(tx.ctx.tx, asyncpg.Connection)
