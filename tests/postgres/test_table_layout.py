"""The "table" dedup layout: migration, refusal to switch layouts, batched cleanup, listing,
and claims that answer exactly as the partitioned layout's."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest

from consumerkit import migrate
from consumerkit.dedup import DedupPolicy, Layout, list_partitions, maintain, store_for
from consumerkit.dedup.cleanup import delete_expired
from consumerkit.dedup.layout import existing_layout
from consumerkit.dedup.partitions import LOCK_SEED
from consumerkit.dedup.retention import register
from consumerkit.envelope import Envelope
from consumerkit.errors import StartupError
from consumerkit.schema import TABLE_DEDUP_STEPS, applied_versions
from consumerkit.types import ClaimRequest, ClaimStatus

from .conftest import Conn, Connect
from .dedup_rows import count_ids

DAY = timedelta(days=1)
TABLE = DedupPolicy(layout="table")


def _envelope(event_id: str, event_time: datetime) -> Envelope:
    return Envelope(event_id=event_id, id_source="header", event_type="order.created",
                    key="k", topic="orders", partition=0, offset=1, timestamp=event_time)


async def _fill(conn: Conn, schema: str, rows: int, seen_at: datetime, prefix: str) -> None:
    """``rows`` rows of one id each, as single claims store them."""
    key = f'"{schema}".consumerkit_name_key'
    await conn.execute(
        f'INSERT INTO "{schema}".processed_events (seen_at, namespace_key, handler_key, texts)'
        f" SELECT $1, {key}('billing'), {key}('charge'), ARRAY[$3 || g]"
        " FROM generate_series(1, $2) AS g", seen_at, rows, prefix)


async def _count(conn: Conn, schema: str) -> int:
    return await count_ids(conn, schema)


async def test_migration_creates_the_table_layout_once(conn: Conn, schema: str) -> None:
    await migrate(conn, schema, TABLE, namespace="billing")
    await migrate(conn, schema, TABLE, namespace="billing")  # idempotent
    assert await existing_layout(conn, schema, "processed_events") == "table"
    versions = await applied_versions(conn, schema)
    assert versions["dedup:processed_events"] == TABLE_DEDUP_STEPS[-1].version
    indexes = await conn.fetch(
        "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1"
        " AND tablename = 'processed_events' ORDER BY 1", schema)
    assert [(i["indexname"], i["indexdef"].split(" USING ")[1]) for i in indexes] == [
        ("processed_events_seen_idx", "btree (seen_at)"),
        ("processed_events_texts_idx", "gin (texts) WITH (fastupdate=off)"),
        ("processed_events_uuids_idx", "gin (uuids) WITH (fastupdate=off)")]
    registered = await conn.fetchval(
        f'SELECT retention FROM "{schema}".consumerkit_retention WHERE namespace = $1',
        "billing")
    assert registered == TABLE.retention


@pytest.mark.parametrize(("first", "second"), [("partitioned", "table"),
                                               ("table", "partitioned")])
async def test_a_table_cannot_change_its_layout(
    conn: Conn, schema: str, first: Layout, second: Layout,
) -> None:
    await migrate(conn, schema, DedupPolicy(layout=first))
    other = DedupPolicy(layout=second)
    with pytest.raises(StartupError, match=f"exists with the '{first}' layout"):
        await migrate(conn, schema, other)
    with pytest.raises(StartupError, match=f"exists with the '{first}' layout"):
        await maintain(conn, schema, other)
    assert await existing_layout(conn, schema, "processed_events") == first
    # another table name is the way out
    await migrate(conn, schema, DedupPolicy(layout=second, table="processed_events_2"))


async def test_maintenance_deletes_expired_rows_in_batches(conn: Conn, schema: str) -> None:
    await migrate(conn, schema, TABLE)
    now: datetime = await conn.fetchval("SELECT now()")
    keep_until = TABLE.retention + TABLE.clock_skew
    await _fill(conn, schema, 25, now - keep_until - DAY, "old-")
    await _fill(conn, schema, 5, now - keep_until + DAY, "young-")
    cleanup = await delete_expired(conn, schema, "processed_events", now - keep_until,
                                   lock_seed=LOCK_SEED, batch_size=10)
    assert (cleanup.deleted, cleanup.finished) == (25, True)
    assert await _count(conn, schema) == 5

    report = await maintain(conn, schema, TABLE, now=now + 2 * DAY)
    assert (report.deleted, report.deferred, report.dropped) == (5, [], [])
    assert await _count(conn, schema) == 0


async def test_maintenance_keeps_rows_a_longer_registered_retention_needs(
    conn: Conn, schema: str,
) -> None:
    await migrate(conn, schema, TABLE)
    await register(conn, schema, "processed_events", "audit", timedelta(days=30))
    now: datetime = await conn.fetchval("SELECT now()")
    await _fill(conn, schema, 3, now - 10 * DAY, "e-")
    report = await maintain(conn, schema, TABLE, namespace="billing")
    assert report.deleted == 0
    assert await _count(conn, schema) == 3
    assert (await maintain(conn, schema, TABLE, now=now + 25 * DAY)).deleted == 3


async def test_a_locked_table_defers_the_cleanup(connect: Connect, schema: str) -> None:
    conn, blocker = await connect(), await connect()
    await migrate(conn, schema, TABLE)
    now: datetime = await conn.fetchval("SELECT now()")
    await _fill(conn, schema, 4, now - 30 * DAY, "e-")
    async with blocker.transaction():
        await blocker.execute(f'LOCK TABLE "{schema}".processed_events IN SHARE MODE')
        report = await maintain(conn, schema, TABLE, lock_timeout=timedelta(milliseconds=100))
        assert (report.deleted, report.deferred) == (0, ["processed_events"])
    assert (await maintain(conn, schema, TABLE)).deleted == 4


async def test_maintenance_outside_a_migrated_schema_fails_clearly(
    conn: Conn, schema: str,
) -> None:
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    with pytest.raises(StartupError, match="does not exist"):
        await maintain(conn, schema, TABLE)


async def test_listing_shows_the_table_with_rows_and_size(conn: Conn, schema: str) -> None:
    await migrate(conn, schema, TABLE)
    now: datetime = await conn.fetchval("SELECT now()")
    await _fill(conn, schema, 1000, now, "e-")
    [estimate] = await list_partitions(conn, schema, "processed_events")
    assert (estimate.name, estimate.lower, estimate.upper) == ("processed_events", None, None)
    assert estimate.size_bytes > 0
    [exact] = await list_partitions(conn, schema, "processed_events", exact=True)
    assert (exact.approx_rows, exact.ids) == (1000, 1000)
    await conn.execute(f'ANALYZE "{schema}".processed_events')
    [analyzed] = await list_partitions(conn, schema, "processed_events")
    assert analyzed.approx_rows == 1000


async def test_exact_counts_per_partition(conn: Conn, migrated: str) -> None:
    now: datetime = await conn.fetchval("SELECT now()")
    await _fill(conn, migrated, 7, now, "e-")
    parts = await list_partitions(conn, migrated, "processed_events", exact=True)
    assert sorted(p.approx_rows or 0 for p in parts)[-1] == 7
    assert sum(p.approx_rows or 0 for p in parts) == 7
    assert sum(p.ids or 0 for p in parts) == 7


async def test_both_layouts_answer_every_batch_alike(connect: Connect, schema: str) -> None:
    """Random batches of repeated, in-window and out-of-window ids, claimed, committed or
    rolled back, give the same statuses in both layouts, and an original time exactly where
    the other layout gives one."""
    conn = await connect()
    names: list[Layout] = ["partitioned", "table"]
    layouts = {name: DedupPolicy(layout=name, table=f"dedup_{name}") for name in names}
    for policy in layouts.values():
        await migrate(conn, schema, policy)
    stores = {name: store_for(schema, policy) for name, policy in layouts.items()}
    rng = random.Random(20240501)
    outcomes: set[tuple[ClaimStatus, bool]] = set()
    now: datetime = await conn.fetchval("SELECT now()")
    for round_ in range(40):
        batch = [ClaimRequest(_envelope(
            f"e-{rng.randrange(30)}",
            now - rng.choice([timedelta(0), 3 * DAY, 8 * DAY, 40 * DAY])), "charge")
            for _ in range(rng.randrange(1, 12))]
        enforce, commit = rng.random() < 0.8, rng.random() < 0.7
        results = {}
        for name, store in stores.items():
            tx = conn.transaction(isolation="read_committed")
            await tx.start()
            results[name] = await store.claim_many(conn, "billing", batch,
                                                   enforce_window=enforce)
            await (tx.commit() if commit else tx.rollback())
        part, table = results["partitioned"], results["table"]
        assert [c.status for c in part] == [c.status for c in table], round_
        assert [c.original_seen_at is None for c in part] == [
            c.original_seen_at is None for c in table], round_
        outcomes |= {(c.status, c.original_seen_at is None) for c in part}
    # every duplicate has its original's time, one of the same batch too (claimed now)
    assert outcomes == {(ClaimStatus.CLAIMED, True), (ClaimStatus.EXPIRED, True),
                        (ClaimStatus.DUPLICATE, False)}
