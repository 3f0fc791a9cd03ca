"""The dead-letter writer: transient sink failures are retried, permanent ones are not.

The rejections come from PostgreSQL itself: a trigger on the dead-letter table raises a data
exception (SQLSTATE class 22), as a column limit or a check written by a DBA would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest

from consumerkit import migrate
from consumerkit.deadletter import DeadLetterEntry, DeadLetterTable, list_dead_letters
from consumerkit.deadletter.writer import DeadLetterWriter
from consumerkit.types import SinkResources

Pool = asyncpg.Pool

ENTRY = DeadLetterEntry(
    consumer="billing", topic="orders", partition=1, offset=9, key=b"order-1",
    value=b'{"blob": "' + b"x" * 100 + b'"}', headers=[("id", b"e-9"), ("trace", None)],
    reason="invalid_payload", detail="blob: too long", attempts=0, event_id="e-9")


async def _reject(pool: Pool, schema: str, condition: str) -> None:
    """Make ``schema``'s dead-letter table refuse rows matching ``condition`` with SQLSTATE
    22001 (string_data_right_truncation, an ``asyncpg.DataError``)."""
    async with pool.acquire() as conn:
        await conn.execute(f"""
            CREATE FUNCTION "{schema}".reject() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF {condition} THEN
                    RAISE EXCEPTION 'row refused' USING ERRCODE = 'string_data_right_truncation';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER reject BEFORE INSERT ON "{schema}".dead_letters
                FOR EACH ROW EXECUTE FUNCTION "{schema}".reject();""")


async def _table(pool: Pool, schema: str) -> DeadLetterTable:
    table = DeadLetterTable()
    await table.open(SinkResources(pool, schema, "unused:9092", {}))
    return table


async def _letters(pool: Pool, schema: str) -> list[DeadLetterEntry]:
    async with pool.acquire() as conn:
        return await list_dead_letters(conn, schema)


@pytest.fixture
async def schema(pg_pool: Pool, pg_schema: str) -> str:
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
    return pg_schema


@pytest.fixture
async def other_schema(pg_pool: Pool, pg_schema: str) -> AsyncIterator[str]:
    """A second migrated schema, dropped afterwards."""
    name = f"{pg_schema}_b"
    async with pg_pool.acquire() as conn:
        await migrate(conn, name)
    yield name
    async with pg_pool.acquire() as conn:
        await conn.execute(f'DROP SCHEMA "{name}" CASCADE')


async def test_a_rejected_entry_is_stored_without_its_value_and_headers(
    pg_pool: Pool, schema: str,
) -> None:
    await _reject(pg_pool, schema, "octet_length(NEW.value) > 16")
    writer = DeadLetterWriter([await _table(pg_pool, schema)])
    stored = await asyncio.wait_for(writer.write(ENTRY, asyncio.Event()), timeout=10)
    assert stored
    assert writer.failures == 0
    [back] = await _letters(pg_pool, schema)
    assert (back.value, list(back.headers), back.key) == (None, [], ENTRY.key)
    assert (back.reason, back.event_id, back.offset) == (ENTRY.reason, "e-9", 9)
    assert back.detail.startswith("blob: too long [value and headers dropped: ")
    assert "StringDataRightTruncationError: row refused" in back.detail


async def test_an_entry_refused_twice_is_counted_and_the_next_sink_still_gets_it(
    pg_pool: Pool, schema: str, other_schema: str, caplog: pytest.LogCaptureFixture,
) -> None:
    await _reject(pg_pool, schema, "true")
    writer = DeadLetterWriter([await _table(pg_pool, schema), await _table(pg_pool, other_schema)])
    with caplog.at_level(logging.WARNING, logger="consumerkit.deadletter"):
        stored = await asyncio.wait_for(writer.write(ENTRY, asyncio.Event()), timeout=10)
    assert stored
    assert writer.failures == 1
    assert await _letters(pg_pool, schema) == []
    assert await _letters(pg_pool, other_schema) == [ENTRY]  # whole, not reduced
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "orders/1/9" in errors[0].getMessage()
    assert "NOT stored" in errors[0].getMessage()


async def test_a_transient_failure_is_retried_until_the_sink_recovers(
    pg_pool: Pool, pg_schema: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """No table yet (UndefinedTableError is no data error): the entry waits for it, whole."""
    writer = DeadLetterWriter([await _table(pg_pool, pg_schema)], max_delay=0.2)
    with caplog.at_level(logging.WARNING, logger="consumerkit.deadletter"):
        task = asyncio.create_task(writer.write(ENTRY, asyncio.Event()))
        for _ in range(500):
            if sum("retrying in" in r.getMessage() for r in caplog.records) >= 2:
                break
            await asyncio.sleep(0.01)
        assert not task.done()
        async with pg_pool.acquire() as conn:
            await migrate(conn, pg_schema)
        assert await asyncio.wait_for(task, timeout=10)
    assert writer.failures == 0
    assert await _letters(pg_pool, pg_schema) == [ENTRY]


async def test_a_transient_failure_is_retried_until_abandoned(
    pg_pool: Pool, pg_schema: str,
) -> None:
    writer = DeadLetterWriter([await _table(pg_pool, pg_schema)], max_delay=0.05)
    abandon = asyncio.Event()
    asyncio.get_running_loop().call_later(0.3, abandon.set)
    assert not await asyncio.wait_for(writer.write(ENTRY, abandon), timeout=10)
    assert writer.failures == 0


async def test_a_reduced_entry_that_fails_transiently_is_retried(
    pg_pool: Pool, schema: str,
) -> None:
    """After a permanent rejection the reduced entry still gets the transient treatment."""
    await _reject(pg_pool, schema, "NEW.value IS NOT NULL")
    async with pg_pool.acquire() as conn:  # the reduced entry then meets a lock wait error
        await conn.execute(f"""
            CREATE FUNCTION "{schema}".busy() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NOT EXISTS (SELECT FROM "{schema}".gate) THEN
                    RAISE EXCEPTION 'busy' USING ERRCODE = 'lock_not_available';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TABLE "{schema}".gate (open boolean);
            CREATE TRIGGER busy BEFORE INSERT ON "{schema}".dead_letters
                FOR EACH ROW WHEN (NEW.value IS NULL) EXECUTE FUNCTION "{schema}".busy();""")
    writer = DeadLetterWriter([await _table(pg_pool, schema)], max_delay=0.05)
    task = asyncio.create_task(writer.write(dataclasses.replace(ENTRY, offset=10), asyncio.Event()))
    await asyncio.sleep(0.3)
    assert not task.done()
    async with pg_pool.acquire() as conn:
        await conn.execute(f'INSERT INTO "{schema}".gate VALUES (true)')
    assert await asyncio.wait_for(task, timeout=10)
    [back] = await _letters(pg_pool, schema)
    assert (back.offset, back.value) == (10, None)
    assert writer.failures == 0
