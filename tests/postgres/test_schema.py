"""migrate: idempotent, safe when several processes run it at once, strict about names."""

from __future__ import annotations

import asyncio
from datetime import UTC

import pytest

from consumerkit import migrate
from consumerkit.dedup import DedupPolicy, list_partitions
from consumerkit.errors import ConfigurationError
from consumerkit.outbox import OutboxTable
from consumerkit.schema import applied_versions, check_synchronous_commit

from .conftest import Conn, Connect


async def _relkinds(conn: Conn, schema: str) -> dict[str, str]:
    rows = await conn.fetch(
        "SELECT c.relname, c.relkind::text AS relkind FROM pg_class c"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND NOT c.relispartition", schema)
    return {row["relname"]: row["relkind"] for row in rows}


async def test_servers_under_test_include_postgres_18(
    conn: Conn, server_dsn: str, embedded_postgres_dsn: str,
) -> None:
    version = await conn.fetchval("SELECT current_setting('server_version_num')::int")
    assert version >= 140000
    if server_dsn == embedded_postgres_dsn:
        assert version // 10000 == 18


async def test_migrate_creates_partitioned_dedup_table_and_dead_letters(
    conn: Conn, migrated: str,
) -> None:
    kinds = await _relkinds(conn, migrated)
    assert kinds == {
        "processed_events": "p", "processed_events_guard": "r", "dead_letters": "r",
        "consumerkit_schema_version": "r",
        "consumerkit_retention": "r", "consumerkit_partition_intervals": "r",
        "consumerkit_names": "r", "consumer_offsets": "r",
        "parked_keys": "r", "parked_records": "r", "parked_audit": "r",
    }
    assert await applied_versions(conn, migrated) == {
        "core": 9, "dedup:processed_events": 8, "parking": 1}
    # migrate ran maintenance: exactly one partition holds the database's now().
    now = await conn.fetchval("SELECT now()")
    parts = await list_partitions(conn, migrated, "processed_events")
    assert [p.name for p in parts if p.lower and p.upper and p.lower <= now < p.upper] == [
        f"processed_events_p{now.astimezone(UTC):%Y%m%d}00"]


async def test_migrate_without_a_dedup_policy_creates_the_outboxes_alone(
    conn: Conn, schema: str,
) -> None:
    outboxes = [OutboxTable(schema, "outbox"), OutboxTable(schema, "orders_outbox")]
    await migrate(conn, schema, None, outboxes=outboxes)
    await migrate(conn, schema, None, outboxes=outboxes)  # idempotent
    assert set(await _relkinds(conn, schema)) == {"consumerkit_schema_version"} | {
        f"{t.table}{side}" for t in outboxes
        for side in ("", "_failures", "_keys", "_leases", "_relays")}
    assert await applied_versions(conn, schema) == {"outbox:outbox": 2,
                                                    "outbox:orders_outbox": 2}
    with pytest.raises(ConfigurationError, match="nothing to migrate"):
        await migrate(conn, schema, None)


async def test_migrate_is_idempotent(conn: Conn, migrated: str) -> None:
    before = await list_partitions(conn, migrated, "processed_events")
    await migrate(conn, migrated)
    await migrate(conn, migrated)
    assert await list_partitions(conn, migrated, "processed_events") == before
    rows = await conn.fetchval(f'SELECT count(*) FROM "{migrated}".consumerkit_schema_version')
    assert rows == 18


async def test_concurrent_migrations_apply_each_step_once(connect: Connect, schema: str) -> None:
    conns = [await connect() for _ in range(5)]
    await asyncio.gather(*(migrate(c, schema) for c in conns))
    rows = await conns[0].fetch(
        f'SELECT component, version FROM "{schema}".consumerkit_schema_version')
    assert sorted((r["component"], r["version"]) for r in rows) == [
        ("core", 1), ("core", 2), ("core", 3), ("core", 4), ("core", 5), ("core", 6),
        ("core", 7), ("core", 8), ("core", 9),
        ("dedup:processed_events", 1), ("dedup:processed_events", 2),
        ("dedup:processed_events", 3), ("dedup:processed_events", 4),
        ("dedup:processed_events", 5), ("dedup:processed_events", 6),
        ("dedup:processed_events", 7), ("dedup:processed_events", 8), ("parking", 1)]
    assert len(await list_partitions(conns[0], schema, "processed_events")) == 5


async def test_a_second_policy_table_is_added(conn: Conn, migrated: str) -> None:
    await migrate(conn, migrated, DedupPolicy(table="audit_events"))
    kinds = await _relkinds(conn, migrated)
    assert kinds["audit_events"] == "p"
    assert kinds["processed_events"] == "p"
    assert await applied_versions(conn, migrated) == {
        "core": 9, "dedup:processed_events": 8, "dedup:audit_events": 8, "parking": 1}


@pytest.mark.parametrize(
    ("schema_name", "policy"),
    [
        ('bad"; DROP TABLE x; --', DedupPolicy()),
        ("Upper", DedupPolicy()),
        ("consumerkit", DedupPolicy(table="t" * 52)),  # partition names would pass 63 chars
    ],
)
async def test_invalid_names_fail_before_any_sql(
    connect: Connect, schema_name: str, policy: DedupPolicy,
) -> None:
    closed = await connect()
    await closed.close()  # any SQL would raise InterfaceError, not ConfigurationError
    with pytest.raises(ConfigurationError):
        await migrate(closed, schema_name, policy)


async def test_longest_table_name_that_fits(conn: Conn, schema: str) -> None:
    table = "t" * 51
    await migrate(conn, schema, DedupPolicy(table=table))
    names = [p.name for p in await list_partitions(conn, schema, table)]
    assert len(names) == 5
    assert all(len(name) == 63 for name in names)


async def test_check_synchronous_commit_reports_the_session_setting(conn: Conn) -> None:
    assert await check_synchronous_commit(conn) == "on"
    await conn.execute("SET synchronous_commit = off")
    assert await check_synchronous_commit(conn) == "off"
