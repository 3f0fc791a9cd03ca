"""The parked keys' tables on a real PostgreSQL: created by migrate, parked records kept in
order with their bytes, the key's row deciding whether a record still joins the park."""

from __future__ import annotations

import asyncio

import asyncpg

from consumerkit import migrate
from consumerkit.engine.replay import discard_key
from consumerkit.grants import runtime_grants
from consumerkit.parking import ParkedRecord, store
from consumerkit.schema import applied_versions


def entry(offset: int, key: bytes = b"order-1", reason: str = "key_parked") -> ParkedRecord:
    return ParkedRecord(
        consumer="billing", topic="orders", partition=3, offset=offset, key=key,
        value=b'{"n": 1}\x00\xff', headers=[("id", b"e-%d" % offset), ("trace", None)],
        timestamp_ms=1_700_000_000_000 + offset, reason=reason, detail="why", attempts=0,
        event_id=f"e-{offset}", event_type="order.created")


async def test_migrate_creates_the_tables_once_and_grants_cover_them(
    pg_pool: asyncpg.Pool, pg_schema: str,
) -> None:
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        await migrate(conn, pg_schema)
        assert (await applied_versions(conn, pg_schema))["parking"] == 1
        grants = "\n".join(await runtime_grants(conn, pg_schema, "app"))
    for table, privileges in (("parked_keys", "SELECT, INSERT, UPDATE, DELETE"),
                              ("parked_records", "SELECT, INSERT, UPDATE, DELETE"),
                              ("parked_audit", "SELECT, INSERT")):
        assert f'GRANT {privileges} ON TABLE "{pg_schema}"."{table}" TO "app";' in grants
    assert f'"{pg_schema}"."parked_records_id_seq" TO "app"' in grants
    assert f'"{pg_schema}"."parked_audit_id_seq" TO "app"' in grants


async def test_records_join_a_park_in_order_until_it_is_discarded(
    pg_pool: asyncpg.Pool, pg_schema: str,
) -> None:
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        # a record joining a key that is not parked is refused: nothing stored
        assert not await store.park(conn, pg_schema, [entry(7)], start=False)
        assert await store.park(conn, pg_schema, [entry(7, reason="handler_failed")],
                                start=True)
        assert await store.park(conn, pg_schema, [entry(9), entry(8)], start=False)
        # a redelivered record is kept as first stored
        assert await store.park(conn, pg_schema, [entry(7, reason="other")], start=False)
        loaded = await store.parked_keys(conn, pg_schema, "billing",
                                         [("orders", 3), ("orders", 4)])
        assert loaded == {("orders", 3): {b"order-1": 3}, ("orders", 4): {}}
        (key,) = await store.list_keys(conn, pg_schema, "billing")
        assert (key.key_text, key.records, key.first_offset) == ("order-1", 3, 7)
        assert key.reason == "handler_failed"
        waiting = await store.waiting(conn, pg_schema, key)
        assert [r.offset for r in waiting] == [7, 8, 9]
        first = waiting[0]
        assert first.value == b'{"n": 1}\x00\xff'
        assert list(first.headers) == [("id", b"e-7"), ("trace", None)]
        assert first.timestamp_ms == 1_700_000_000_007
        assert first.reason == "handler_failed"
        # replay marks one of three: the key cannot be finished yet
        await conn.execute(store.mark_replayed_sql(pg_schema), first.id)
        assert await store.finish(conn, pg_schema, key) is None
        parked, dropped = await discard_key(conn, pg_schema, "billing", b"order-1")
        assert (parked.key, dropped) == (b"order-1", 2)
        audit = await conn.fetch(
            f'SELECT action, records, actor, db_role FROM "{pg_schema}".parked_audit')
        assert [(a["action"], a["records"]) for a in audit] == [("discarded", 2)]
        assert "@" in audit[0]["actor"]
        assert audit[0]["db_role"]
        assert await conn.fetchval(f'SELECT count(*) FROM "{pg_schema}".parked_records') == 0
        # the park is gone: a later record of the key is refused, to be applied normally
        assert not await store.park(conn, pg_schema, [entry(10)], start=False)


async def test_a_key_parked_while_its_row_is_removed_is_parked_anew(
    pg_pool: asyncpg.Pool, pg_schema: str,
) -> None:
    """A record's retries run out while a replay finishes (or a discard removes) the key's
    row: the record parks its key anew instead of finding nothing to park under (and being
    dead-lettered)."""
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        assert await store.park(conn, pg_schema, [entry(7, reason="handler_failed")],
                                start=True)
    keys = f'"{pg_schema}".parked_keys'
    async with pg_pool.acquire() as finisher, pg_pool.acquire() as consumer:
        parker = consumer.get_server_pid()
        tx = finisher.transaction()
        await tx.start()
        await finisher.execute(f"SELECT 1 FROM {keys} WHERE key = $1 FOR UPDATE", b"order-1")
        parking = asyncio.create_task(store.park(
            consumer, pg_schema, [entry(11, reason="handler_failed")], start=True))
        async with asyncio.timeout(30):  # the park waits for the finisher's row lock
            while await finisher.fetchval(
                    "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1",
                    parker) != "Lock":
                await asyncio.sleep(0.01)
        await finisher.execute(f"DELETE FROM {keys} WHERE key = $1", b"order-1")
        await tx.commit()
        assert await asyncio.wait_for(parking, 30)
        assert await finisher.fetchval(f"SELECT count(*) FROM {keys}") == 1
