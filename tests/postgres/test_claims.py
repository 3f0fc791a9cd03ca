"""Claims: first wins, duplicates see the original, rollbacks leave nothing, zombies wait."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import asyncpg
import pytest

from consumerkit import migrate
from consumerkit.dedup import DedupPolicy, PostgresDedupStore, maintain
from consumerkit.envelope import Envelope
from consumerkit.errors import ConfigurationError
from consumerkit.types import Claim, ClaimRequest, ClaimStatus

from .claim_waits import claim_waiting
from .conftest import Conn, Connect
from .dedup_rows import details, store_ids, stored

DAY = timedelta(days=1)


def _envelope(
    event_id: str, event_time: datetime | None = None, offset: int = 7, *, timeless: bool = False,
) -> Envelope:
    stamp = None if timeless else event_time or datetime.now().astimezone()
    return Envelope(
        event_id=event_id, id_source="header", event_type="order.created", key="order-1",
        topic="orders", partition=2, offset=offset, timestamp=stamp)


async def _claim(
    store: PostgresDedupStore, conn: Conn, envelope: Envelope, *, commit: bool = True,
    enforce_window: bool = True,
) -> Claim:
    tx = conn.transaction()
    await tx.start()
    try:
        claim = await store.claim(
            conn, "billing", envelope, "charge", enforce_window=enforce_window)
    except BaseException:
        await tx.rollback()
        raise
    await (tx.commit() if commit else tx.rollback())
    return claim


async def _rows(conn: Conn, schema: str, event_id: str) -> list[asyncpg.Record]:
    return await stored(conn, schema, event_id)


async def test_first_claim_wins_and_the_second_sees_the_original(
    conn: Conn, migrated: str,
) -> None:
    store = PostgresDedupStore(migrated)
    assert await _claim(store, conn, _envelope("e-1")) == Claim(ClaimStatus.CLAIMED)
    [row] = await _rows(conn, migrated, "e-1")
    assert (row["namespace"], row["handler"], row["details"]) == ("billing", "charge", None)
    assert row["seen_at"] == await store.seen(conn, "billing", "e-1")

    again = await _claim(store, conn, _envelope("e-1", offset=8))
    assert again == Claim(ClaimStatus.DUPLICATE, row["seen_at"])
    assert len(await _rows(conn, migrated, "e-1")) == 1


async def test_namespaces_are_independent(conn: Conn, migrated: str) -> None:
    store = PostgresDedupStore(migrated)
    await _claim(store, conn, _envelope("e-2"))
    async with conn.transaction():
        other = await store.claim(conn, "inventory", _envelope("e-2"), "reserve")
    assert other.status is ClaimStatus.CLAIMED
    assert await store.seen(conn, "shipping", "e-2") is None


async def test_a_rolled_back_claim_leaves_no_row(conn: Conn, migrated: str) -> None:
    store = PostgresDedupStore(migrated)
    first = await _claim(store, conn, _envelope("e-3"), commit=False)
    assert first.status is ClaimStatus.CLAIMED
    assert await _rows(conn, migrated, "e-3") == []
    assert (await _claim(store, conn, _envelope("e-3"))).status is ClaimStatus.CLAIMED


async def test_an_original_in_an_older_partition_is_found(conn: Conn, migrated: str) -> None:
    now: datetime = await conn.fetchval("SELECT now()")
    await maintain(conn, migrated, DedupPolicy(), now=now - 3 * DAY)  # inside retention
    seen_at = now - 3 * DAY
    await store_ids(conn, migrated, "billing", ["e-4"], seen_at)
    store = PostgresDedupStore(migrated)
    claim = await _claim(store, conn, _envelope("e-4"))
    assert claim == Claim(ClaimStatus.DUPLICATE, seen_at)


async def test_events_older_than_the_window_expire_unless_the_window_is_off(
    conn: Conn, migrated: str,
) -> None:
    store = PostgresDedupStore(migrated, DedupPolicy(diagnostics=True))
    now: datetime = await conn.fetchval("SELECT now()")
    old = _envelope("e-5", event_time=now - 8 * DAY)
    assert await _claim(store, conn, old) == Claim(ClaimStatus.EXPIRED)
    assert await _rows(conn, migrated, "e-5") == []

    assert (await _claim(store, conn, old, enforce_window=False)).status is ClaimStatus.CLAIMED
    [row] = await _rows(conn, migrated, "e-5")
    assert details(row)["event_time"] is None  # not checked, so not recorded

    recent = _envelope("e-6", event_time=now - 6 * DAY)
    assert (await _claim(store, conn, recent)).status is ClaimStatus.CLAIMED
    [row] = await _rows(conn, migrated, "e-6")
    assert datetime.fromisoformat(details(row)["event_time"]) == now - 6 * DAY


async def test_an_event_without_a_time_is_claimed_without_the_window(
    conn: Conn, migrated: str,
) -> None:
    store = PostgresDedupStore(migrated, DedupPolicy(diagnostics=True))
    timeless = _envelope("e-5b", timeless=True)
    assert timeless.event_time is None
    assert await _claim(store, conn, timeless) == Claim(ClaimStatus.CLAIMED)
    [row] = await _rows(conn, migrated, "e-5b")
    assert details(row)["event_time"] is None
    assert (await _claim(store, conn, timeless)).status is ClaimStatus.DUPLICATE


async def test_a_known_event_is_a_duplicate_even_when_its_time_is_outside_the_window(
    conn: Conn, migrated: str,
) -> None:
    store = PostgresDedupStore(migrated)
    now: datetime = await conn.fetchval("SELECT now()")
    await _claim(store, conn, _envelope("e-7"))
    late = await _claim(store, conn, _envelope("e-7", event_time=now - 30 * DAY))
    assert late.status is ClaimStatus.DUPLICATE


async def test_claims_refuse_snapshot_isolation(conn: Conn, migrated: str) -> None:
    store = PostgresDedupStore(migrated)
    with pytest.raises(asyncpg.FeatureNotSupportedError, match="READ COMMITTED"):
        async with conn.transaction(isolation="repeatable_read"):
            await store.claim(conn, "billing", _envelope("e-8"), "charge")


async def test_a_claim_needs_a_partition_for_now(conn: Conn, migrated: str) -> None:
    now: datetime = await conn.fetchval("SELECT now()")
    await maintain(conn, migrated, DedupPolicy(), now=now + 30 * DAY)  # drops today's partition
    with pytest.raises(asyncpg.CheckViolationError, match="no partition"):
        await _claim(PostgresDedupStore(migrated), conn, _envelope("e-9"))


def test_names_are_validated() -> None:
    with pytest.raises(ConfigurationError):
        PostgresDedupStore("bad-schema")
    with pytest.raises(ConfigurationError):
        PostgresDedupStore("consumerkit", DedupPolicy(table="x" * 58))  # x..x_claim > 63


@pytest.mark.parametrize(
    ("first_commits", "second_sees"), [(True, ClaimStatus.DUPLICATE), (False, ClaimStatus.CLAIMED)],
    ids=["commit", "rollback"])
async def test_a_concurrent_claim_waits_for_the_first_transaction(
    connect: Connect, migrated: str, first_commits: bool, second_sees: ClaimStatus,
) -> None:
    owner, zombie, observer = await connect(), await connect(), await connect()
    store = PostgresDedupStore(migrated, DedupPolicy(diagnostics=True))
    tx = owner.transaction()
    await tx.start()
    first = await store.claim(owner, "billing", _envelope("e-10"), "charge")
    assert first.status is ClaimStatus.CLAIMED

    second = asyncio.create_task(_claim(store, zombie, _envelope("e-10", offset=9)))
    await claim_waiting(observer, zombie)
    assert not second.done()

    await (tx.commit() if first_commits else tx.rollback())
    result = await asyncio.wait_for(second, timeout=10)
    assert result.status is second_sees
    rows = await _rows(observer, migrated, "e-10")
    assert len(rows) == 1
    assert details(rows[0])["offset"] == (7 if first_commits else 9)
    if first_commits:
        assert result.original_seen_at == rows[0]["seen_at"]


async def test_a_claim_stops_waiting_after_the_claim_lock_timeout(
    connect: Connect, migrated: str,
) -> None:
    """A holder that never ends (a zombie stopped inside its transaction) cannot block the
    new owner forever: the wait ends with LockNotAvailableError (55P03)."""
    zombie, owner = await connect(), await connect()
    tx = zombie.transaction()
    await tx.start()
    try:
        held = await PostgresDedupStore(migrated).claim(zombie, "billing", _envelope("e-11"), "c")
        assert held.status is ClaimStatus.CLAIMED
        impatient = PostgresDedupStore(
            migrated, DedupPolicy(claim_lock_timeout=timedelta(milliseconds=200)))
        started = asyncio.get_running_loop().time()
        with pytest.raises(asyncpg.LockNotAvailableError):
            await asyncio.wait_for(_claim(impatient, owner, _envelope("e-11")), timeout=10)
        assert asyncio.get_running_loop().time() - started >= 0.2
    finally:
        await tx.rollback()
    # The zombie's claim rolled back: the owner now claims at once.
    assert (await _claim(impatient, owner, _envelope("e-11"))).status is ClaimStatus.CLAIMED


@pytest.mark.parametrize("session_timeout", [None, "7s"])
async def test_the_claim_leaves_the_sessions_lock_timeout_to_the_handler(
    conn: Conn, migrated: str, session_timeout: str | None,
) -> None:
    if session_timeout is not None:
        await conn.execute(f"SET lock_timeout = '{session_timeout}'")
    original = await conn.fetchval("SELECT current_setting('lock_timeout')")
    store = PostgresDedupStore(migrated, DedupPolicy(claim_lock_timeout=timedelta(seconds=3)))
    async with conn.transaction():
        claim = await store.claim(conn, "billing", _envelope("e-12"), "charge")
        assert claim.status is ClaimStatus.CLAIMED
        assert await conn.fetchval("SELECT current_setting('lock_timeout')") == original
    assert await conn.fetchval("SELECT current_setting('lock_timeout')") == original


async def test_a_batch_of_young_events_and_one_near_the_window_s_end(
    conn: Conn, migrated: str,
) -> None:
    """Event times are sent to the claim only when some event is old enough to matter: a
    young batch is claimed without them, a batch with one event past the window judges it."""
    store = PostgresDedupStore(migrated)
    now: datetime = await conn.fetchval("SELECT now()")
    young = [ClaimRequest(_envelope(f"y-{n}", event_time=now - n * timedelta(hours=1)),
                          "charge") for n in range(3)]
    batch = [*young[:2], ClaimRequest(_envelope("late", event_time=now - 8 * DAY), "charge"),
             ClaimRequest(_envelope("mid", event_time=now - 6 * DAY), "charge")]
    async with conn.transaction():
        first = await store.claim_many(conn, "billing", young[2:])
        claims = await store.claim_many(conn, "billing", batch)
    assert [c.status for c in first] == [ClaimStatus.CLAIMED]
    assert [c.status for c in claims] == [
        ClaimStatus.CLAIMED, ClaimStatus.CLAIMED, ClaimStatus.EXPIRED, ClaimStatus.CLAIMED]
    assert store._young([now - timedelta(days=3)])
    assert not store._young([now - timedelta(days=3), now - timedelta(days=4)])
    assert store._young([None])
    assert not store._young([datetime.now(), now])  # a naive time: the database judges it


async def test_a_batch_of_two_handlers_keeps_each_id_s_handler(conn: Conn, migrated: str) -> None:
    store = PostgresDedupStore(migrated)
    requests = [ClaimRequest(_envelope("h-1"), "charge"), ClaimRequest(_envelope("h-2"), "ship"),
                ClaimRequest(_envelope("h-3"), "charge")]
    async with conn.transaction():
        claims = await store.claim_many(conn, "billing", requests)
    assert {c.status for c in claims} == {ClaimStatus.CLAIMED}
    handlers = {i: [r["handler"] for r in await _rows(conn, migrated, i)]
                for i in ("h-1", "h-2", "h-3")}
    assert handlers == {"h-1": ["charge"], "h-2": ["ship"], "h-3": ["charge"]}


async def _claim_functions(conn: Conn, schema: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT pg_get_function_identity_arguments(p.oid) AS args FROM pg_proc p"
        " JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = $1 AND p.proname = 'processed_events_claim'", schema)
    return [row["args"] for row in rows]


async def test_migration_leaves_no_stale_claim_function(conn: Conn, schema: str) -> None:
    """Earlier single-id claim functions (with or without ``p_lock_timeout``) write rows of a
    layout that is gone: the migration drops every one of them."""
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.execute(
        f'CREATE FUNCTION "{schema}".processed_events_claim(p_namespace text, p_event_id text,'
        " p_event_time timestamptz, p_retention interval, p_handler text, p_event_type text,"
        " p_id_source text, p_topic text, p_partition integer, p_offset bigint)"
        " RETURNS TABLE (status text, original_seen_at timestamptz)"
        " LANGUAGE sql AS $$ SELECT 'claimed', NULL::timestamptz $$")
    await migrate(conn, schema)
    assert await _claim_functions(conn, schema) == []
