"""An outbox kept for a retention in time partitions, for change data capture: partitions made
ahead with the publication Debezium reads, writes landing in the partition of their insert
time, partitions past the retention dropped whole while newer ones stay, the relay's and
cleanup's refusals, and the command line."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import pytest_asyncio

from consumerkit import Postgres, migrate
from consumerkit.cli import main
from consumerkit.dedup import DedupPolicy
from consumerkit.dedup.partitions import list_partitions, maintain, partition_floor
from consumerkit.engine.upkeep import DedupUpkeep
from consumerkit.errors import ConfigurationError, StartupError
from consumerkit.observability.observer import fanout
from consumerkit.outbox import (
    Outbox,
    OutboxEvent,
    OutboxRetention,
    OutboxTable,
    Relay,
    cleanup,
    maintain_outbox,
)
from consumerkit.outbox.debezium import event_router_config
from consumerkit.outbox.retention import plan

from ..pooling import POOLER

DAY = timedelta(days=1)
KEEP = OutboxRetention(retention=timedelta(days=2), partition_interval=DAY, premake=3)


@pytest_asyncio.fixture(loop_scope="session")
async def kept(pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str
               ) -> AsyncIterator[OutboxTable]:
    """A migrated outbox kept two days; its publication (per database) dropped afterwards."""
    table = OutboxTable(pg_schema, "outbox", KEEP)
    async with pg_pool.acquire() as conn:
        await migrate(conn, dedup=None, outboxes=[table])
    yield table
    await pg_pool.execute(f'DROP PUBLICATION IF EXISTS "{table.publication}"')


async def _add(pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox, key: str,
               **extra: object) -> object:
    async with pool.acquire() as conn, conn.transaction():
        return await outbox.add(conn, event_type="order.placed", aggregate_type="orders",
                                aggregate_id=key, payload={"key": key}, **extra)  # type: ignore[arg-type]


async def test_migrate_makes_partitions_ahead_and_the_publication_debezium_reads(
    pg_pool: asyncpg.Pool[asyncpg.Record], kept: OutboxTable,
) -> None:
    async with pg_pool.acquire() as conn:
        now: datetime = await conn.fetchval("SELECT now()")
        parts = await list_partitions(conn, kept.schema, kept.table)
        assert await conn.fetchval("SELECT relkind::text FROM pg_class WHERE oid = $1::regclass",
                                   f"{kept.schema}.{kept.table}") == "p"
        publication = await conn.fetchrow(
            "SELECT pubviaroot, (SELECT array_agg(schemaname || '.' || tablename) FROM "
            "pg_publication_tables t WHERE t.pubname = p.pubname) AS tables "
            "FROM pg_publication p WHERE pubname = $1", kept.publication)
        again = await conn.fetchval("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON "
                                    "n.oid = c.relnamespace WHERE n.nspname = $1", kept.schema)
        await migrate(conn, dedup=None, outboxes=[kept])  # a second run finds everything there
        assert await conn.fetchval("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON "
                                   "n.oid = c.relnamespace WHERE n.nspname = $1",
                                   kept.schema) == again
    today = partition_floor(now, DAY)
    # the previous day (a transaction begun before midnight), today and three ahead
    assert [p.lower for p in parts] == [today + k * DAY for k in range(-1, 4)]
    assert publication is not None
    assert publication["pubviaroot"] is True
    # the root's name, as the EventRouter's table.include.list has it
    assert publication["tables"] == [f"{kept.schema}.{kept.table}"]
    config = event_router_config(kept)
    assert config["table.include.list"] == f"{kept.schema}.{kept.table}"
    assert config["publication.name"] == kept.publication
    assert config["publication.autocreate.mode"] == "disabled"
    assert config["slot.name"] == kept.replication_slot


async def test_writes_land_in_the_partition_of_their_insert_time_whatever_occurred_at(
    pg_pool: asyncpg.Pool[asyncpg.Record], kept: OutboxTable,
) -> None:
    outbox = Outbox(kept.schema, kept.table, notify=False, retention=KEEP)
    long_ago = datetime(2020, 1, 1, tzinfo=UTC)  # no partition covers 2020: created_at rules
    first = await _add(pg_pool, outbox, "a", occurred_at=long_ago, dedup_key="k-1")
    second = await _add(pg_pool, outbox, "b")
    assert await _add(pg_pool, outbox, "a", dedup_key="k-1") is None  # keys still refuse
    rows = await pg_pool.fetch(
        f"SELECT id, occurred_at, tableoid::regclass::text AS part, created_at FROM {kept.events}"
        " ORDER BY seq")
    assert [r["id"] for r in rows] == [first, second]
    assert rows[0]["occurred_at"] == long_ago
    today = partition_floor(rows[1]["created_at"], DAY)
    assert {r["part"] for r in rows} == {f"{kept.schema}.outbox_p{today:%Y%m%d%H}"}


async def test_partitions_past_the_retention_are_dropped_whole_and_newer_ones_stay(
    pg_pool: asyncpg.Pool[asyncpg.Record], kept: OutboxTable,
) -> None:
    """Rows of ten days ago (their partition made then) and their idempotency keys go with
    maintenance; yesterday's and today's rows stay; the old partition is gone as a table."""
    async with pg_pool.acquire() as conn:
        now: datetime = await conn.fetchval("SELECT now()")
        await maintain(conn, kept.schema, plan(kept), now=now - 10 * DAY)  # as it ran then
        insert = (f"INSERT INTO {kept.events} (id, aggregatetype, aggregateid, type, payload,"
                  " occurred_at, created_at) SELECT gen_random_uuid(), 'orders', 'k' || g,"
                  " 'order.placed', '{}', $1, $1 FROM generate_series(1, $2) AS g")
        for age, rows in ((10 * DAY, 50), (DAY, 7), (timedelta(0), 3)):
            await conn.execute(insert, now - age, rows)
        await conn.execute(f"INSERT INTO {kept.keys} (dedup_key, id, created_at) VALUES "
                           "('old', gen_random_uuid(), $1), ('new', gen_random_uuid(), $2)",
                           now - 10 * DAY, now)
        old = f"outbox_p{partition_floor(now - 10 * DAY, DAY):%Y%m%d%H}"
        assert old in {p.name for p in await list_partitions(conn, kept.schema, kept.table)}

        report = await maintain_outbox(conn, kept)

        left = await conn.fetch(f"SELECT created_at FROM {kept.events}")
        names = {p.name for p in await list_partitions(conn, kept.schema, kept.table)}
        exists = await conn.fetchval("SELECT to_regclass($1)", f"{kept.schema}.{old}")
        keys = {r["dedup_key"] for r in await conn.fetch(f"SELECT dedup_key FROM {kept.keys}")}
    assert old in report.dropped
    assert report.deferred == []
    # the days made ten days ago are all past the retention (2 days): dropped as tables,
    # so their rows went with them, not by a DELETE
    horizon = f"outbox_p{partition_floor(now - 2 * DAY, DAY):%Y%m%d%H}"
    assert names
    assert all(n >= horizon for n in names)
    assert exists is None
    assert old not in names
    assert len(left) == 10
    assert min(r["created_at"] for r in left) >= now - DAY
    assert keys == {"new"}


async def test_the_relay_and_cleanup_refuse_the_partitioned_layout_with_one_line(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kept: OutboxTable,
) -> None:
    outbox = Outbox(kept.schema, kept.table, notify=False, retention=KEEP)
    await _add(pg_pool, outbox, "a")
    sink = _Refusing()
    relay = Relay(Postgres(dsn=postgres_dsn, schema=kept.schema, pooler=POOLER), sink,
                  table=kept.table,
                  handle_signals=False, poll_interval=0.1)
    with pytest.raises(StartupError) as refused:
        async with asyncio.timeout(60):
            await relay.run()
    assert "time partitions" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert sink.sent == []
    assert relay.published == 0
    async with pg_pool.acquire() as conn:
        with pytest.raises(ConfigurationError, match="maintain_outbox"):
            await cleanup(conn, timedelta(days=1), table=kept)
        # the other layout asked of an existing table is refused either way
        with pytest.raises(StartupError, match="time partitions"):
            await migrate(conn, dedup=None, outboxes=[OutboxTable(kept.schema, kept.table)])
        plain = OutboxTable(kept.schema, "plain")
        await migrate(conn, dedup=None, outboxes=[plain])
        with pytest.raises(StartupError, match="plain table"):
            await migrate(conn, dedup=None, outboxes=[OutboxTable(kept.schema, "plain", KEEP)])
        with pytest.raises(StartupError, match="not partitioned"):
            await maintain_outbox(conn, OutboxTable(kept.schema, "plain", KEEP))
    assert await pg_pool.fetchval(f"SELECT count(*) FROM {kept.events}") == 1


def test_retention_settings_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="at least one partition_interval"):
        OutboxRetention(retention=timedelta(hours=1))
    with pytest.raises(ConfigurationError, match="divide 24 hours"):
        OutboxRetention(partition_interval=timedelta(hours=5))
    with pytest.raises(ConfigurationError, match="at most 51 characters"):
        OutboxTable("s", "x" * 52, OutboxRetention())
    with pytest.raises(ConfigurationError, match="either deletes each row"):
        Outbox("s", "t", delete_after_insert=True, retention=OutboxRetention())
    long = OutboxTable("s" * 40, "t" * 30, OutboxRetention())
    assert len(long.publication) <= 63
    assert long.publication.startswith("t" * 30 + "_cdc_")


async def test_the_command_line_migrates_and_maintains_a_retained_outbox(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool[asyncpg.Record],
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    table = OutboxTable(pg_schema, "outbox", KEEP)
    try:
        code, out = await _cli(capsys, "migrate", *db, "--outbox-only",
                               "--outbox-retention", "2d")
        assert code == 0, out
        assert await pg_pool.fetchval("SELECT count(*) FROM pg_publication WHERE pubname = $1",
                                      table.publication) == 1
        code, out = await _cli(capsys, "outbox", "maintain", *db)
        assert code == 1
        assert "pass --retention" in out
        code, out = await _cli(capsys, "outbox", "cleanup", *db, "--older-than", "2d")
        assert code == 1
        assert "time partitions" in out
        assert "Traceback" not in out
        code, out = await _cli(capsys, "outbox", "maintain", *db, "--retention", "2d")
        assert code == 0
        assert "dropped none" in out
        assert len(await pg_pool.fetch(
            "SELECT 1 FROM pg_inherits WHERE inhparent = $1::regclass",
            f"{pg_schema}.outbox")) == 5
    finally:
        await pg_pool.execute(f'DROP PUBLICATION IF EXISTS "{table.publication}"')


async def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    def run() -> tuple[int, str]:
        code = main(list(argv))
        out = capsys.readouterr()
        return code, out.out + out.err
    return await asyncio.to_thread(run)


class _Refusing:
    """A sink that records what it is given: the relay must give it nothing."""

    def __init__(self) -> None:
        self.sent: list[OutboxEvent] = []

    async def open(self) -> None:
        return None

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        self.sent.extend(events)
        return [None] * len(events)

    async def close(self) -> None:
        return None


async def test_a_consumer_keeps_its_retained_outbox_with_its_dedup_maintenance(
    pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str,
) -> None:
    """The consumer's upkeep (what ``Consumer`` runs at start and every maintenance
    interval) migrates an ``outbox=`` kept for a retention, then drops its expired days."""
    outbox = Outbox(pg_schema, "outbox", notify=False, retention=KEEP)
    upkeep = DedupUpkeep(pg_pool, pg_schema, DedupPolicy(), "billing", fanout([]))
    try:
        await upkeep.prepare(auto_migrate=True, outbox=outbox)
        async with pg_pool.acquire() as conn:
            now: datetime = await conn.fetchval("SELECT now()")
            assert len(await list_partitions(conn, pg_schema, "outbox")) == 5
            await maintain(conn, pg_schema, plan(outbox.table), now=now - 10 * DAY)
            assert len(await list_partitions(conn, pg_schema, "outbox")) == 10
        await upkeep.prepare(auto_migrate=False, outbox=outbox)  # a start without migrating
        async with pg_pool.acquire() as conn:
            parts = await list_partitions(conn, pg_schema, "outbox")
        assert [p.lower for p in parts] == [partition_floor(now, DAY) + k * DAY
                                            for k in range(-1, 4)]
    finally:
        await pg_pool.execute(f'DROP PUBLICATION IF EXISTS "{outbox.table.publication}"')
