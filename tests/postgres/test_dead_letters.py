"""The dead-letter table: exact bytes back, one row per position however often it is sent."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import asyncpg
import pytest

from consumerkit import migrate
from consumerkit.deadletter import DeadLetterEntry, DeadLetterTable, list_dead_letters
from consumerkit.errors import ConsumerKitError
from consumerkit.types import SinkResources


def _entry(offset: int, consumer: str = "billing", detail: str = "boom") -> DeadLetterEntry:
    return DeadLetterEntry(
        consumer=consumer, topic="orders", partition=3, offset=offset,
        key=b"\x00order-1\xff", value=b'{"total": 12}\x80\x81',
        headers=[("id", b"e-1"), ("trace", b"\x00\x01\xfe"), ("id", b""), ("empty", b"")],
        reason="handler_failed", detail=detail, attempts=5, event_id="e-1",
        event_type="order.created", failed_at=datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC))


@pytest.fixture
async def sink(pg_pool: asyncpg.Pool, pg_schema: str) -> DeadLetterTable:
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
    table = DeadLetterTable()
    await table.open(SinkResources(pg_pool, pg_schema, "unused:9092", {}))
    return table


async def test_entries_round_trip_exactly(
    sink: DeadLetterTable, pg_pool: asyncpg.Pool, pg_schema: str,
) -> None:
    entry = _entry(41)
    await sink.send(entry)
    async with pg_pool.acquire() as conn:
        assert await list_dead_letters(conn, pg_schema) == [entry]


async def test_null_key_value_and_no_headers(
    sink: DeadLetterTable, pg_pool: asyncpg.Pool, pg_schema: str,
) -> None:
    entry = DeadLetterEntry(
        consumer="billing", topic="orders", partition=0, offset=1, key=None, value=None,
        headers=[], reason="invalid_json", detail="empty value")
    await sink.send(entry)
    async with pg_pool.acquire() as conn:
        [back] = await list_dead_letters(conn, pg_schema)
    assert (back.key, back.value, list(back.headers), back.event_id) == (None, None, [], None)
    assert back.failed_at == entry.failed_at


async def test_send_is_idempotent_per_position(
    sink: DeadLetterTable, pg_pool: asyncpg.Pool, pg_schema: str,
) -> None:
    first = _entry(42, detail="first failure")
    await sink.send(first)
    await sink.send(_entry(42, detail="resent after a crash"))
    await sink.send(_entry(43))
    await sink.send(_entry(42, consumer="shipping"))
    async with pg_pool.acquire() as conn:
        billing = await list_dead_letters(conn, pg_schema, consumer="billing")
        shipping = await list_dead_letters(conn, pg_schema, consumer="shipping")
        limited = await list_dead_letters(conn, pg_schema, limit=2)
    assert [(e.offset, e.detail) for e in billing] == [(42, "first failure"), (43, "boom")]
    assert [(e.consumer, e.offset) for e in shipping] == [("shipping", 42)]
    assert [e.offset for e in limited] == [42, 43]


async def test_send_needs_an_open_table(sink: DeadLetterTable) -> None:
    await sink.close()
    with pytest.raises(ConsumerKitError, match="not open"):
        await sink.send(_entry(1))
    with pytest.raises(ConsumerKitError, match="not open"):
        await DeadLetterTable().send(_entry(1))


async def test_null_header_values_are_kept(
    sink: DeadLetterTable, pg_pool: asyncpg.Pool, pg_schema: str,
) -> None:
    entry = dataclasses.replace(
        _entry(44), headers=[("id", b"e-1"), ("gone", None), ("empty", b""), ("gone", None)])
    await sink.send(entry)
    async with pg_pool.acquire() as conn:
        assert await list_dead_letters(conn, pg_schema) == [entry]
        stored = await conn.fetchval(f'SELECT headers::text FROM "{pg_schema}".dead_letters')
    assert '["gone", null]' in stored


async def test_text_postgresql_cannot_store_is_escaped(
    sink: DeadLetterTable, pg_pool: asyncpg.Pool, pg_schema: str,
) -> None:
    """NUL (refused by text and jsonb) and lone surrogates (not encodable as UTF-8) in any
    text: the row is stored with the characters escaped, the bytes columns stay exact."""
    entry = dataclasses.replace(
        _entry(45), headers=[("a\x00b", b"\x00"), ("x\udc80", b"v")],
        reason="invalid\x00event_id", detail="id 'e\x00\x01' has \udcff control characters",
        event_id="e\x00\x01", event_type="order\x00created")
    await sink.send(entry)
    async with pg_pool.acquire() as conn:
        [back] = await list_dead_letters(conn, pg_schema)
    assert (back.reason, back.event_id, back.event_type) == (
        "invalid\\x00event_id", "e\\x00\x01", "order\\x00created")
    # the detail is shown escaped besides (consumerkit.display): \x01 too
    assert back.detail == "id 'e\\x00\\x01' has \\udcff control characters"
    assert list(back.headers) == [("a\\x00b", b"\x00"), ("x\\udc80", b"v")]
    assert (back.key, back.value) == (entry.key, entry.value)
