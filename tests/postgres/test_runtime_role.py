"""Maintenance under a runtime role without DDL rights, on both servers: partitions made ahead
and expired ones dropped as the clock moves (``maintain(now=...)``), the table layout's
cleanup, an outbox kept in partitions, the GRANTs :func:`runtime_grants` prints, and the
maintenance functions refusing what is not theirs to do."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from consumerkit import DedupPolicy, migrate
from consumerkit.dedup.partitions import list_partitions, maintain, partition_floor
from consumerkit.errors import ConfigurationError
from consumerkit.grants import runtime_grants
from consumerkit.outbox import (
    Outbox,
    OutboxRetention,
    OutboxTable,
    maintain_outbox,
)
from consumerkit.outbox.retention import plan

from .conftest import Conn
from .dedup_rows import count_ids, store_ids

HOUR = timedelta(hours=1)
POLICY = DedupPolicy(partition_interval=HOUR, retention=HOUR, clock_skew=timedelta(0))


@pytest.fixture
async def runtime(server_dsn: str, conn: Conn) -> AsyncIterator[str]:
    """A LOGIN role with no rights yet, dropped with whatever was granted to it."""
    role = f"ck_rt_{uuid.uuid4().hex[:8]}"
    await conn.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        yield role
    finally:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await conn.execute(f'DROP OWNED BY "{role}"')
        await conn.execute(f'DROP ROLE "{role}"')


async def as_runtime(server_dsn: str, conn: Conn, schema: str, role: str) -> Conn:
    """Grant ``role`` what :func:`runtime_grants` prints; a connection as ``role``."""
    for statement in await runtime_grants(conn, schema, role):
        await conn.execute(statement)
    assert not await conn.fetchval("SELECT has_schema_privilege($1, $2, 'CREATE')", role, schema)
    parts = urlsplit(server_dsn)
    dsn = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
    runtime: Conn = await asyncpg.connect(dsn)
    return runtime


async def test_a_runtime_role_makes_partitions_ahead_and_drops_expired_ones(
    server_dsn: str, conn: Conn, schema: str, runtime: str,
) -> None:
    await migrate(conn, schema, POLICY)
    role_conn = await as_runtime(server_dsn, conn, schema, runtime)
    try:
        start = partition_floor(datetime.now(UTC), HOUR)
        before = {p.name for p in await list_partitions(role_conn, schema, POLICY.table)}
        later = start + 10 * HOUR  # the clock moves: every earlier partition has expired
        report = await maintain(role_conn, schema, POLICY, now=later, namespace="rt")
    finally:
        await role_conn.close()
    after = await list_partitions(conn, schema, POLICY.table)
    assert report.created
    assert not report.deferred
    assert set(report.dropped) == before
    assert not before & {p.name for p in after}
    assert max(p.lower for p in after if p.lower) == later + POLICY.premake * HOUR
    owners = await conn.fetch(
        "SELECT DISTINCT pg_get_userbyid(c.relowner) AS owner FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1", schema)
    assert runtime not in {r["owner"] for r in owners}  # it owns nothing it made


async def test_a_runtime_role_cleans_a_table_layout(
    server_dsn: str, conn: Conn, schema: str, runtime: str,
) -> None:
    policy = DedupPolicy(retention=HOUR, partition_interval=HOUR, clock_skew=timedelta(0),
                         layout="table",
                         table="plain_events")
    await migrate(conn, schema, policy)
    old: datetime = await conn.fetchval("SELECT now() - interval '3 hours'")
    await store_ids(conn, schema, "rt", [f"e{g}" for g in range(25)], old, table="plain_events")
    await store_ids(conn, schema, "rt", [f"f{g}" for g in range(25)], old, table="plain_events")
    role_conn = await as_runtime(server_dsn, conn, schema, runtime)
    try:
        report = await maintain(role_conn, schema, policy, namespace="rt")
    finally:
        await role_conn.close()
    assert report.deleted == 50
    assert await count_ids(conn, schema, "plain_events") == 0


@pytest.mark.parametrize(("table", "name"), [
    ("consumerkit_retention", "consumerkit_retention_p2024010100"),  # not a dedup table
    ("processed_events", "processed_events_p20240101"),  # not a partition name
    ("processed_events", "processed_events_p2024010100; DROP TABLE x"),
    ("processed_events", 'ledger"; DROP SCHEMA public; --'),
    ("processed_events", "other_p2024010100"),
])
async def test_the_maintenance_functions_refuse_anything_else(
    server_dsn: str, conn: Conn, schema: str, runtime: str, table: str, name: str,
) -> None:
    await migrate(conn, schema, POLICY)
    role_conn = await as_runtime(server_dsn, conn, schema, runtime)
    try:
        for function in ("consumerkit_create_partition", "consumerkit_detach_partition",
                         "consumerkit_drop_partition"):
            args = "$1, $2, now(), now() + interval '1 hour'" if "create" in function else (
                "$1, $2")
            with pytest.raises(asyncpg.InsufficientPrivilegeError, match="consumerkit: "):
                await role_conn.execute(f'SELECT "{schema}".{function}({args})', table, name)
    finally:
        await role_conn.close()


async def test_execute_is_not_granted_to_public(conn: Conn, schema: str) -> None:
    await migrate(conn, schema, POLICY)
    granted = await conn.fetchval(
        "SELECT bool_or(has_function_privilege('public', p.oid, 'EXECUTE')) FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = $1 AND p.proname LIKE 'consumerkit\\_%'", schema)
    assert granted is False


@pytest.mark.parametrize("role", ['app"; DROP TABLE x; --', "", "a b", "x" * 64])
async def test_a_bad_role_name_is_refused(conn: Conn, schema: str, role: str) -> None:
    await migrate(conn, schema, POLICY)
    with pytest.raises(ConfigurationError, match="invalid role name"):
        await runtime_grants(conn, schema, role)


async def test_grants_name_consumerkit_functions_only(
    server_dsn: str, conn: Conn, schema: str, runtime: str,
) -> None:
    await migrate(conn, schema, POLICY)
    # a schema shared with the application: its functions are not consumerkit's to grant
    await conn.execute(f'CREATE FUNCTION "{schema}".app_refund(int) RETURNS int '
                       "LANGUAGE sql AS 'SELECT $1'")
    await conn.execute(f'CREATE FUNCTION "{schema}"."AppAudit"() RETURNS int '
                       "LANGUAGE sql AS 'SELECT 1'")
    statements = await runtime_grants(conn, schema, runtime)
    functions = [s for s in statements if " ON FUNCTION " in s]
    assert not [s for s in functions if "app_refund" in s or "AppAudit" in s]
    assert len(functions) == 5  # the three maintenance functions, the two claim functions
    role_conn = await as_runtime(server_dsn, conn, schema, runtime)
    try:
        await maintain(role_conn, schema, POLICY, namespace="rt")  # still enough to run
    finally:
        await role_conn.close()


@pytest.mark.parametrize(("lower", "upper"), [
    (timedelta(0), timedelta(days=3650)),  # named for one hour, covering ten years
    (timedelta(0), 2 * HOUR),  # wider than the recorded interval
    (-HOUR, HOUR),  # starts before the hour it is named for
    (HOUR, 2 * HOUR),  # starts after it
])
async def test_the_create_function_refuses_bounds_other_than_the_name_and_interval(
    server_dsn: str, conn: Conn, schema: str, runtime: str, lower: timedelta,
    upper: timedelta,
) -> None:
    await migrate(conn, schema, POLICY)
    hour = partition_floor(datetime.now(UTC), HOUR) + 1000 * HOUR  # beyond those made ahead
    name = f"{POLICY.table}_p{hour:%Y%m%d%H}"
    role_conn = await as_runtime(server_dsn, conn, schema, runtime)
    # the name is read as UTC whatever the session's zone (here one with DST)
    await role_conn.execute("SET TimeZone = 'America/New_York'")
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="consumerkit: partition"):
            await role_conn.execute(
                f'SELECT "{schema}".consumerkit_create_partition($1, $2, $3, $4)',
                POLICY.table, name, hour + lower, hour + upper)
        await role_conn.execute(  # the name's own hour, one interval wide: allowed
            f'SELECT "{schema}".consumerkit_create_partition($1, $2, $3, $4)',
            POLICY.table, name, hour, hour + HOUR)
    finally:
        await role_conn.close()
    [part] = [p for p in await list_partitions(conn, schema, POLICY.table) if p.name == name]
    assert (part.lower, part.upper) == (hour, hour + HOUR)


async def test_migrate_warns_when_its_role_is_a_superuser(
    conn: Conn, schema: str, caplog: pytest.LogCaptureFixture,
) -> None:
    superuser = await conn.fetchval(
        "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
    with caplog.at_level(logging.WARNING, "consumerkit.schema"):
        await migrate(conn, schema, POLICY)
        await migrate(conn, schema, POLICY)  # found migrated, as at each consumer's start
    warned = [r for r in caplog.records if "runs as a superuser" in r.getMessage()]
    assert len(warned) == (1 if superuser else 0)  # once: when the functions were created
    assert superuser  # the test servers' role is one, so the warning is exercised


async def test_the_create_function_reads_the_name_as_utc_in_a_dst_gap(
    server_dsn: str, conn: Conn, schema: str, runtime: str,
) -> None:
    """02:00 on 2026-03-29 does not exist in Paris: the name must still read as 02:00 UTC."""
    await migrate(conn, schema, POLICY)
    hour = datetime(2026, 3, 29, 2, tzinfo=UTC)
    role_conn = await as_runtime(server_dsn, conn, schema, runtime)
    await role_conn.execute("SET TimeZone = 'Europe/Paris'")
    try:
        await role_conn.execute(
            f'SELECT "{schema}".consumerkit_create_partition($1, $2, $3, $4)',
            POLICY.table, f"{POLICY.table}_p2026032902", hour, hour + HOUR)
    finally:
        await role_conn.close()
    names = {p.name for p in await list_partitions(conn, schema, POLICY.table)}
    assert f"{POLICY.table}_p2026032902" in names


async def test_a_runtime_role_writes_to_and_maintains_an_outbox_kept_in_partitions(
    server_dsn: str, conn: Conn, schema: str, runtime: str,
) -> None:
    """The owner migrates an outbox kept for a retention; the runtime role writes to it and
    drops its expired days through the owner's functions, owning nothing."""
    keep = OutboxRetention(retention=timedelta(days=2))
    table = OutboxTable(schema, "outbox", keep)
    await migrate(conn, schema, POLICY)
    await migrate(conn, dedup=None, outboxes=[table])
    try:
        now: datetime = await conn.fetchval("SELECT now()")
        await maintain(conn, schema, plan(table), now=now - timedelta(days=10))
        old = {p.name for p in await list_partitions(conn, schema, "outbox")
               if p.upper is not None and p.upper <= now - timedelta(days=2)}
        role_conn = await as_runtime(server_dsn, conn, schema, runtime)
        try:
            async with role_conn.transaction():
                added = await Outbox(schema, "outbox", notify=False, retention=keep).add(
                    role_conn, event_type="order.placed", aggregate_type="orders",
                    aggregate_id="o-1", payload={"n": 1}, dedup_key="o-1")
            report = await maintain_outbox(role_conn, table)
        finally:
            await role_conn.close()
        assert old
        assert set(report.dropped) == old
        assert not report.deferred
        assert await conn.fetchval(f"SELECT id FROM {table.events}") == added
        owners = await conn.fetch(
            "SELECT DISTINCT pg_get_userbyid(c.relowner) AS owner FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1", schema)
        assert runtime not in {r["owner"] for r in owners}
    finally:
        await conn.execute(f'DROP PUBLICATION IF EXISTS "{table.publication}"')
