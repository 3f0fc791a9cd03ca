"""Partition maintenance: created ahead, dropped whole once expired, safe to run concurrently."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import asyncpg
import pytest

from consumerkit.dedup import DedupPolicy, list_partitions, maintain
from consumerkit.dedup.partitions import partition_floor, partition_name
from consumerkit.dedup.retention import registrations
from consumerkit.errors import ConfigurationError, StartupError

from .conftest import Conn, Connect

DAY = timedelta(days=1)
POLICY = DedupPolicy()  # 7 days of retention, daily partitions, 3 made ahead, 1 hour of skew
KEPT = POLICY.retention + POLICY.clock_skew  # how long past its upper bound a partition stays


async def _db_now(conn: Conn) -> datetime:
    now: datetime = await conn.fetchval("SELECT now()")
    return now


async def _names(conn: Conn, schema: str, table: str = "processed_events") -> list[str]:
    return [p.name for p in await list_partitions(conn, schema, table)]


def _expected(now: datetime, policy: DedupPolicy = POLICY, table: str = "processed_events",
              ) -> list[str]:
    first = partition_floor(now, policy.partition_interval) - policy.partition_interval
    return [partition_name(table, first + k * policy.partition_interval)
            for k in range(policy.premake + 2)]


async def test_partitions_cover_previous_current_and_premade(conn: Conn, migrated: str) -> None:
    now = await _db_now(conn)
    parts = await list_partitions(conn, migrated, "processed_events")
    assert [p.name for p in parts] == _expected(now)
    floor = partition_floor(now, DAY)
    assert parts[0].lower == floor - DAY
    assert parts[-1].upper == floor + 4 * DAY
    assert all(a.upper == b.lower for a, b in pairwise(parts))
    assert all(p.size_bytes > 0 for p in parts)  # the index of each partition has a page


async def test_partition_bounds_are_utc_whatever_the_session_time_zone(
    conn: Conn, migrated: str,
) -> None:
    await conn.execute("SET TIME ZONE 'Asia/Kathmandu'")  # +05:45: no whole-hour offset
    later = datetime(2031, 3, 9, 22, 10, tzinfo=UTC)
    report = await maintain(conn, migrated, POLICY, now=later)
    assert report.created == _expected(later)
    parts = await list_partitions(conn, migrated, "processed_events")
    assert parts[-1].upper == datetime(2031, 3, 13, tzinfo=UTC)


async def test_maintenance_is_a_no_op_when_everything_exists(conn: Conn, migrated: str) -> None:
    report = await maintain(conn, migrated, POLICY)
    assert (report.created, report.dropped, report.deferred) == ([], [], [])


async def test_expired_partitions_are_dropped_and_retained_ones_stay(
    conn: Conn, migrated: str,
) -> None:
    now = await _db_now(conn)
    original = _expected(now)
    table = f'"{migrated}".processed_events'
    await conn.execute(f"INSERT INTO {table} (namespace_key, handler_key, texts)"
                       " VALUES (1, 1, ARRAY['old-event'])")
    current_oid = await conn.fetchval("SELECT $1::regclass::oid", f"{migrated}.{original[1]}")

    # Six days on, the oldest partition (upper bound = today's midnight) is still in the window.
    report = await maintain(conn, migrated, POLICY, now=now + 6 * DAY)
    assert report.dropped == []

    # Eight days and the skew on, the previous and the current partition lie wholly before
    # now - (7 days + skew).
    later = now + 8 * DAY + POLICY.clock_skew
    report = await maintain(conn, migrated, POLICY, now=later)
    assert report.dropped == original[:2]
    names = await _names(conn, migrated)
    assert names[:3] == original[2:]
    assert set(_expected(later)) <= set(names)
    # The relation is gone (DROP TABLE), not emptied, and its row went with it.
    assert await conn.fetchval("SELECT count(*) FROM pg_class WHERE oid = $1", current_oid) == 0
    assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0


async def test_a_partition_is_dropped_exactly_when_its_upper_bound_leaves_the_window(
    conn: Conn, migrated: str,
) -> None:
    now = await _db_now(conn)
    original = _expected(now)
    floor = partition_floor(now, DAY)  # the upper bound of the previous partition
    just_before = floor + KEPT - timedelta(microseconds=1)
    assert (await maintain(conn, migrated, POLICY, now=just_before)).dropped == []
    report = await maintain(conn, migrated, POLICY, now=floor + KEPT)
    assert report.dropped == original[:1]


async def test_the_clock_skew_margin_keeps_partitions_past_the_retention(
    conn: Conn, migrated: str,
) -> None:
    """A producer clock ``skew`` ahead makes a redelivery expire ``skew`` late: until then its
    row must still be there, so the partition holding it outlives the retention by ``skew``."""
    skew = timedelta(hours=5)
    policy = DedupPolicy(clock_skew=skew)
    now = await _db_now(conn)
    original = _expected(now)
    floor = partition_floor(now, DAY)  # the upper bound of the previous partition
    just_before = floor + policy.retention + skew - timedelta(microseconds=1)
    assert (await maintain(conn, migrated, policy, now=just_before)).dropped == []
    report = await maintain(conn, migrated, policy, now=floor + policy.retention + skew)
    assert report.dropped == original[:1]


async def test_without_a_skew_margin_a_partition_goes_at_the_retention(
    conn: Conn, migrated: str,
) -> None:
    policy = DedupPolicy(clock_skew=timedelta(0))
    now = await _db_now(conn)
    floor = partition_floor(now, DAY)
    report = await maintain(conn, migrated, policy, now=floor + policy.retention)
    assert report.dropped == _expected(now)[:1]


async def test_concurrent_maintenance_creates_and_drops_each_partition_once(
    connect: Connect, migrated: str,
) -> None:
    conns = [await connect() for _ in range(5)]
    now = await _db_now(conns[0])
    later = now + 30 * DAY
    reports = await asyncio.gather(*(maintain(c, migrated, POLICY, now=later) for c in conns))
    created = [name for r in reports for name in r.created]
    dropped = [name for r in reports for name in r.dropped]
    assert sorted(created) == _expected(later)
    assert sorted(dropped) == _expected(now)
    assert await _names(conns[0], migrated) == _expected(later)


async def test_creating_partitions_does_not_wait_for_open_claims(
    connect: Connect, migrated: str,
) -> None:
    holder, maintainer = await connect(), await connect()
    tx = holder.transaction()
    await tx.start()
    try:
        await holder.execute(f'SELECT count(*) FROM "{migrated}".processed_events')
        later = await _db_now(maintainer) + 2 * DAY
        report = await asyncio.wait_for(
            maintain(maintainer, migrated, POLICY, now=later, lock_timeout=timedelta(seconds=1)),
            timeout=10)
        assert report.created == _expected(later)[-2:]
    finally:
        await tx.rollback()


async def test_a_drop_blocked_by_an_open_transaction_is_deferred_then_done(
    connect: Connect, migrated: str,
) -> None:
    holder, maintainer = await connect(), await connect()
    now = await _db_now(maintainer)
    later = now + 8 * DAY + POLICY.clock_skew
    tx = holder.transaction()
    await tx.start()
    await holder.execute(f'SELECT count(*) FROM "{migrated}".processed_events')
    try:
        report = await maintain(
            maintainer, migrated, POLICY, now=later, lock_timeout=timedelta(milliseconds=200))
    finally:
        await tx.rollback()
    assert report.dropped == []
    assert report.deferred == _expected(now)[:2]
    assert report.created  # creation survived the failed drop
    report = await maintain(maintainer, migrated, POLICY, now=later)
    assert report.dropped == _expected(now)[:2]


async def test_a_changed_interval_fills_only_the_gaps(conn: Conn, migrated: str) -> None:
    floor = partition_floor(await _db_now(conn), DAY)
    hourly = DedupPolicy(partition_interval=timedelta(hours=1), premake=3)
    # Two hours before the daily partitions run out: the hourly window reaches 2 hours past.
    report = await maintain(conn, migrated, hourly, now=floor + 4 * DAY - timedelta(hours=2))
    end = floor + 4 * DAY
    assert report.created == [partition_name("processed_events", end),
                              partition_name("processed_events", end + timedelta(hours=1))]
    parts = await list_partitions(conn, migrated, "processed_events")
    assert all(a.upper == b.lower for a, b in pairwise(parts))


async def test_maintenance_requires_the_table(conn: Conn, schema: str) -> None:
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    with pytest.raises(StartupError, match="run migrate"):
        await maintain(conn, schema, POLICY)


async def test_naive_time_is_refused(conn: Conn, migrated: str) -> None:
    with pytest.raises(ConfigurationError, match="timezone-aware"):
        await maintain(conn, migrated, POLICY, now=datetime(2031, 1, 1))


async def test_rows_outside_every_partition_are_refused(conn: Conn, migrated: str) -> None:
    with pytest.raises(asyncpg.CheckViolationError, match="no partition"):
        await conn.execute(
            f'INSERT INTO "{migrated}".processed_events (seen_at, namespace_key, handler_key,'
            " texts) VALUES (now() + interval '30 days', 1, 1, ARRAY['e'])")


async def test_the_longest_registered_retention_protects_shared_tables(
    conn: Conn, migrated: str,
) -> None:
    """A consumer keeping 30 days shares the table with one keeping 2 days: maintenance run
    with the short retention (or by the CLI's defaults) must not drop what the long one needs."""
    now = await _db_now(conn)
    original = _expected(now)
    long_policy = DedupPolicy(retention=timedelta(days=30))
    short_policy = DedupPolicy(retention=timedelta(days=2))
    await maintain(conn, migrated, long_policy, namespace="ledger")
    report = await maintain(conn, migrated, short_policy, namespace="mailer", now=now + 10 * DAY)
    assert report.dropped == []  # the 30-day registration wins
    assert await registrations(conn, migrated) == [
        ("processed_events", "ledger", timedelta(days=30)),
        ("processed_events", "mailer", timedelta(days=2)),
    ]
    report = await maintain(conn, migrated, short_policy, now=now + 32 * DAY)
    assert report.dropped[:2] == original[:2]
