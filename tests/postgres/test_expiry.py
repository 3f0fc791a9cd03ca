"""Expired partitions are detached, then dropped where no claim waits on the drop."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from consumerkit.dedup import DedupPolicy, PostgresDedupStore, list_partitions, maintain
from consumerkit.dedup.expiry import detach, marker
from consumerkit.dedup.partitions import partition_floor, partition_name
from consumerkit.envelope import Envelope
from consumerkit.types import ClaimStatus

from .conftest import Conn, Connect
from .dedup_rows import store_ids

POLICY = DedupPolicy()
DAY = timedelta(days=1)


async def _expired_later(conn: Conn) -> datetime:
    """A maintenance time at which the first two partitions made at migration are expired."""
    now: datetime = await conn.fetchval("SELECT now()")
    return now + 8 * DAY + POLICY.clock_skew


async def _interrupted(conn: Conn, schema: str) -> str:
    """A partition of a day ten days ago, detached and marked, as a run stopped before its
    drops leaves it."""
    now: datetime = await conn.fetchval("SELECT now()")
    day = partition_floor(now - 10 * DAY, DAY)
    name = partition_name(POLICY.table, day)
    await conn.execute(f'CREATE TABLE "{schema}".{name} (LIKE "{schema}".{POLICY.table})')
    await conn.execute(
        f'ALTER TABLE "{schema}".{POLICY.table} ATTACH PARTITION "{schema}".{name} '
        f"FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + DAY).isoformat()}')")
    async with conn.transaction():
        assert await detach(conn, schema, POLICY.table, name)
    return name


async def _tables(conn: Conn, schema: str) -> set[str]:
    return {r["tablename"] for r in await conn.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)}


async def test_a_detached_partition_left_by_an_interrupted_run_is_dropped_next_run(
    conn: Conn, migrated: str,
) -> None:
    left = await _interrupted(conn, migrated)
    assert left not in [p.name for p in await list_partitions(conn, migrated, POLICY.table)]
    comment = await conn.fetchval(
        "SELECT obj_description($1::regclass, 'pg_class')", f'"{migrated}".{left}')
    assert comment == marker(POLICY.table)
    report = await maintain(conn, migrated, POLICY)  # nothing expired now: only the leftover
    assert (report.dropped, report.deferred) == ([left], [])
    assert left not in await _tables(conn, migrated)


async def test_only_marked_tables_are_dropped(conn: Conn, migrated: str) -> None:
    lookalike = f"{POLICY.table}_p2001010100"
    await conn.execute(f'CREATE TABLE "{migrated}".{lookalike} (x int)')
    await conn.execute(f"""COMMENT ON TABLE "{migrated}".{lookalike} IS 'someone else''s'""")
    await conn.execute(f'CREATE TABLE "{migrated}".other_table (x int)')
    other_mark = marker("another_dedup_table").replace("'", "''")
    await conn.execute(f"""COMMENT ON TABLE "{migrated}".other_table IS '{other_mark}'""")
    report = await maintain(conn, migrated, POLICY, now=await _expired_later(conn))
    assert len(report.dropped) == 2  # the two expired partitions, nothing else
    assert {lookalike, "other_table"} <= await _tables(conn, migrated)


async def test_a_drop_that_waits_blocks_no_claim(connect: Connect, migrated: str) -> None:
    """The drop of a detached partition waits here on a reader of that table; meanwhile
    claims on the dedup table go through, since the drop holds no lock of the parent's."""
    conn, holder, claimer = await connect(), await connect(), await connect()
    left = await _interrupted(conn, migrated)
    reader = holder.transaction()
    await reader.start()
    await holder.execute(f'SELECT count(*) FROM "{migrated}".{left}')
    maintenance = asyncio.create_task(
        maintain(conn, migrated, POLICY, lock_timeout=timedelta(seconds=30)))
    try:
        # wait until the drop is queued on the reader's lock
        async def waiting() -> bool:
            return bool(await claimer.fetchval(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass",
                f'"{migrated}".{left}'))
        async with asyncio.timeout(20):
            while not await waiting():
                await asyncio.sleep(0.02)
        store = PostgresDedupStore(migrated, POLICY)
        envelope = Envelope(event_id="e-during-drop", id_source="header",
                            event_type="order.created", key="k", topic="orders", partition=0,
                            offset=1, timestamp=datetime.now().astimezone())
        async with asyncio.timeout(5):  # with the parent locked this would wait 30 s
            async with claimer.transaction():
                claim = await store.claim(claimer, "billing", envelope, "charge")
        assert claim.status is ClaimStatus.CLAIMED
        assert not maintenance.done()
    finally:
        await reader.rollback()
    report = await asyncio.wait_for(maintenance, 30)
    assert report.dropped == [left]


async def test_a_drop_that_cannot_get_its_lock_is_deferred_then_done(
    connect: Connect, migrated: str,
) -> None:
    conn, holder = await connect(), await connect()
    left = await _interrupted(conn, migrated)
    reader = holder.transaction()
    await reader.start()
    await holder.execute(f'SELECT count(*) FROM "{migrated}".{left}')
    try:
        report = await maintain(conn, migrated, POLICY, lock_timeout=timedelta(milliseconds=200))
    finally:
        await reader.rollback()
    assert (report.dropped, report.deferred) == ([], [left])
    report = await maintain(conn, migrated, POLICY)
    assert (report.dropped, report.deferred) == ([left], [])


async def test_concurrent_maintainers_drop_each_partition_once(
    connect: Connect, migrated: str,
) -> None:
    conns = [await connect() for _ in range(4)]
    later = await _expired_later(conns[0])
    reports = await asyncio.gather(*(maintain(c, migrated, POLICY, now=later) for c in conns))
    dropped = [name for r in reports for name in r.dropped]
    assert len(dropped) == len(set(dropped)) == 2
    assert not [name for r in reports for name in r.deferred]


async def test_a_leftover_whose_name_a_new_range_takes_is_never_adopted(
    conn: Conn, migrated: str,
) -> None:
    """After a change of partition_interval a wanted range can start where a detached,
    marked leftover did, and so take its name. The leftover (expired rows) is dropped and a
    fresh partition made; it is never attached back with its rows and its marker."""
    first = (await list_partitions(conn, migrated, POLICY.table))[0]
    assert first.lower is not None
    await store_ids(conn, migrated, "billing", ["stale"], first.lower, table=POLICY.table)
    async with conn.transaction():
        assert await detach(conn, migrated, POLICY.table, first.name)
    report = await maintain(conn, migrated, POLICY)
    assert report.created == [first.name]
    assert first.name in [p.name for p in await list_partitions(conn, migrated, POLICY.table)]
    assert await conn.fetchval(f'SELECT count(*) FROM "{migrated}".{first.name}') == 0
    assert await conn.fetchval(
        "SELECT obj_description($1::regclass, 'pg_class')",
        f'"{migrated}".{first.name}') is None
