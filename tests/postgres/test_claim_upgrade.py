"""The upgrade from the claim's per-id advisory locks to the guard, while consumers claim."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import pytest

from consumerkit import migrate
from consumerkit.dedup import DedupPolicy, PostgresDedupStore
from consumerkit.dedup.rows import claim_many_ddl
from consumerkit.envelope import Envelope
from consumerkit.errors import StartupError
from consumerkit.schema import applied_versions
from consumerkit.types import Claim, ClaimRequest, ClaimStatus

from .conftest import Conn, Connect
from .dedup_rows import store_ids

CLAIMED, DUPLICATE = ClaimStatus.CLAIMED, ClaimStatus.DUPLICATE
COMPONENT = "dedup:processed_events"
LAST_ADVISORY = {"partitioned": 6, "table": 4}
"""The last version of each layout whose claim took one advisory lock per id."""


def _requests(ids: list[str]) -> list[ClaimRequest]:
    now = datetime.now().astimezone()
    return [ClaimRequest(Envelope(
        event_id=e, id_source="header", event_type="order.created", key="k", topic="orders",
        partition=0, offset=n, timestamp=now), "charge") for n, e in enumerate(ids)]


async def _claim(store: PostgresDedupStore, conn: Conn, ids: list[str]) -> list[ClaimStatus]:
    async with conn.transaction(isolation="read_committed"):
        claims: list[Claim] = await store.claim_many(conn, "billing", _requests(ids))
    return [c.status for c in claims]


async def _as_before_the_guard(conn: Conn, schema: str, policy: DedupPolicy) -> None:
    """Put ``schema`` back where a deployment of the last advisory-lock version is: that
    claim function, no guard, its steps recorded last."""
    await conn.execute(claim_many_ddl(schema, policy, "advisory"))
    await conn.execute(f'DROP TABLE "{schema}".processed_events_guard')
    await conn.execute(
        f'DELETE FROM "{schema}".consumerkit_schema_version'
        " WHERE component = $1 AND version > $2", COMPONENT, LAST_ADVISORY[policy.layout])


async def _waiting(observer: Conn, blocked: Conn) -> bool:
    return bool(await observer.fetchval(
        "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted",
        blocked.get_server_pid()))


async def _until(condition: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(3000):
        if await condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never {what}")


async def _body(conn: Conn, schema: str) -> str:
    return str(await conn.fetchval(
        "SELECT pg_get_functiondef(($1 || '.processed_events_claim_many')::regproc)", schema))


@pytest.mark.parametrize("layout", ["partitioned", "table"])
async def test_an_event_claimed_before_the_upgrade_is_absorbed_after_it(
    conn: Conn, schema: str, layout: str,
) -> None:
    policy = DedupPolicy(layout=layout)  # type: ignore[arg-type]
    await migrate(conn, schema, policy, namespace="billing")
    await _as_before_the_guard(conn, schema, policy)
    store = PostgresDedupStore(schema, policy)
    assert await _claim(store, conn, ["before", "order-9"]) == [CLAIMED] * 2
    # claimed at the start of the oldest partition there is, by an older version
    await store_ids(conn, schema, "billing", ["oldest-kept"],
                    await conn.fetchval("SELECT date_trunc('day', now())"))

    await migrate(conn, schema, policy, namespace="billing")
    versions = await applied_versions(conn, schema)
    assert versions[COMPONENT] == LAST_ADVISORY[layout] + 2
    assert "pg_advisory_xact_lock" not in await _body(conn, schema)
    assert await _claim(store, conn, ["before", "order-9", "oldest-kept", "after"]) == [
        DUPLICATE, DUPLICATE, DUPLICATE, CLAIMED]


async def test_a_claim_held_with_the_old_body_is_not_doubled_while_the_migration_runs(
    connect: Connect, schema: str,
) -> None:
    """A consumer holds a claim of the old body (advisory locks only) open across the
    upgrade: the transitional body's claim of the same id waits for it, and the guard-only
    body is not installed before it ends (a guard-only claim would not wait for it)."""
    holder, migrator, copy, observer = (await connect(), await connect(), await connect(),
                                        await connect())
    policy = DedupPolicy()
    await migrate(migrator, schema, policy)
    await _as_before_the_guard(migrator, schema, policy)
    store = PostgresDedupStore(schema, policy)
    held = holder.transaction(isolation="read_committed")
    await held.start()
    assert [c.status for c in await store.claim_many(holder, "billing", _requests(["x"]))] == [
        CLAIMED]

    migrating = asyncio.create_task(migrate(migrator, schema, policy,
                                            older_transactions_timeout=60))

    async def transitional() -> bool:
        return (await applied_versions(observer, schema)).get(COMPONENT) == 7
    await _until(transitional, "installed the transitional claim")
    copying = asyncio.create_task(_claim(store, copy, ["x", "y"]))

    async def copy_waits() -> bool:
        return await _waiting(observer, copy)
    await _until(copy_waits, "made the copy wait for the held claim")
    assert not migrating.done()
    assert "pg_advisory_xact_lock" in await _body(observer, schema)
    await held.commit()
    assert await asyncio.wait_for(copying, 30) == [DUPLICATE, CLAIMED]
    await asyncio.wait_for(migrating, 30)
    assert (await applied_versions(observer, schema))[COMPONENT] == 8
    assert "pg_advisory_xact_lock" not in await _body(observer, schema)
    assert await _claim(store, copy, ["x", "y", "z"]) == [DUPLICATE, DUPLICATE, CLAIMED]


async def test_the_migration_names_the_transaction_it_outwaits(
    connect: Connect, schema: str,
) -> None:
    """An older transaction that does not end fails the migration after its timeout with
    one line naming its pid; claims keep working on the transitional body meanwhile, and the
    next migration finishes the upgrade."""
    idle, migrator = await connect(), await connect()
    policy = DedupPolicy()
    await migrate(migrator, schema, policy)
    await _as_before_the_guard(migrator, schema, policy)
    store = PostgresDedupStore(schema, policy)
    stuck = idle.transaction()
    await stuck.start()
    await idle.execute("SELECT 1")
    with pytest.raises(StartupError) as raised:
        await migrate(migrator, schema, policy, older_transactions_timeout=0.5)
    message = str(raised.value)
    assert f"pid {idle.get_server_pid()} (idle in transaction)" in message
    assert "\n" not in message
    assert (await applied_versions(migrator, schema))[COMPONENT] == 7
    assert await _claim(store, migrator, ["during"]) == [CLAIMED]
    await stuck.rollback()
    await migrate(migrator, schema, policy, older_transactions_timeout=30)
    assert (await applied_versions(migrator, schema))[COMPONENT] == 8
    assert await _claim(store, migrator, ["during"]) == [DUPLICATE]


async def test_a_new_dedup_table_is_not_held_up_by_older_transactions(
    connect: Connect, schema: str,
) -> None:
    """No claim can have used a table created by this very migration: nothing to wait for."""
    idle, migrator = await connect(), await connect()
    stuck = idle.transaction()
    await stuck.start()
    await idle.execute("SELECT 1")
    try:
        await asyncio.wait_for(migrate(migrator, schema, older_transactions_timeout=0.5),
                               timedelta(seconds=60).total_seconds())
    finally:
        await stuck.rollback()
    assert (await applied_versions(migrator, schema))[COMPONENT] == 8


async def test_concurrent_upgrades_apply_each_step_once(connect: Connect, schema: str) -> None:
    """Every consumer process migrates at start-up: five upgrading the same deployment at
    once wait for each other's first transaction, never for ever, and record each step once."""
    conns = [await connect() for _ in range(5)]
    policy = DedupPolicy()
    await migrate(conns[0], schema, policy)
    await _as_before_the_guard(conns[0], schema, policy)
    await asyncio.wait_for(asyncio.gather(*(
        migrate(c, schema, policy, older_transactions_timeout=30) for c in conns)), 120)
    rows = await conns[0].fetch(
        f'SELECT version FROM "{schema}".consumerkit_schema_version WHERE component = $1'
        " AND version > 6 ORDER BY version", COMPONENT)
    assert [r["version"] for r in rows] == [7, 8]


async def test_an_upgrade_inside_the_caller_s_transaction_is_refused(
    connect: Connect, schema: str,
) -> None:
    """Inside a transaction both steps would commit at once, the transitional body and the
    guard-only one, with no wait between: claims of the old body still running and of the
    new one would not exclude each other. The upgrade refuses, and changes nothing."""
    migrator = await connect()
    policy = DedupPolicy()
    await migrate(migrator, schema, policy)
    await _as_before_the_guard(migrator, schema, policy)
    outer = migrator.transaction()
    await outer.start()
    with pytest.raises(StartupError, match="outside a transaction"):
        await migrate(migrator, schema, policy, older_transactions_timeout=0.5)
    await outer.rollback()
    assert (await applied_versions(migrator, schema))[COMPONENT] == LAST_ADVISORY["partitioned"]
