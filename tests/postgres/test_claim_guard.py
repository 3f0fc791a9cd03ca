"""The claim's wait on the guard table: concurrent copies of an id wait for the first claim,
and a claim holds a constant number of lock-table entries, whatever its batch size."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

import asyncpg
import pytest

from consumerkit.dedup import DedupPolicy, PostgresDedupStore
from consumerkit.envelope import Envelope
from consumerkit.types import Claim, ClaimRequest, ClaimStatus

from .claim_waits import claim_waiting
from .conftest import Conn, Connect

CLAIMED, DUPLICATE = ClaimStatus.CLAIMED, ClaimStatus.DUPLICATE
MIXED = ["8d0f3c52-5f7e-4a43-9d0a-3c1f2b6e9a10", "order-17:created", "ÿ-not-ascii", "42"]
ENTRIES_PER_CLAIM = 64
"""A bound on one claim transaction's lock-table entries: relation locks of the partitions
in the window and their indexes, the guard, its index, the names table, the transaction's own
ids, one transaction id waited for. Measured: 18 on PostgreSQL 15, 20 on 18, for 5 ids or
500."""


def _requests(ids: list[str], stamp: datetime | None = None) -> list[ClaimRequest]:
    stamp = stamp or datetime.now().astimezone()
    return [ClaimRequest(Envelope(
        event_id=e, id_source="header", event_type="order.created", key="k", topic="orders",
        partition=0, offset=n, timestamp=stamp), "charge") for n, e in enumerate(ids)]


async def _claim(store: PostgresDedupStore, conn: Conn, namespace: str, ids: list[str],
                 ) -> list[Claim]:
    async with conn.transaction(isolation="read_committed"):
        return await store.claim_many(conn, namespace, _requests(ids))


async def _entries(observer: Conn, pid: int | None = None) -> int:
    """Lock-table entries of every kind (fast-path ones included), of ``pid`` or of all."""
    return int(await observer.fetchval(
        "SELECT count(*) FROM pg_locks WHERE $1::int IS NULL OR pid = $1", pid))


async def test_an_uncommitted_deleted_entry_still_makes_a_concurrent_insert_wait(
    connect: Connect, schema: str,
) -> None:
    """What the guard relies on, on each server under test: a unique-index insert waits for
    a transaction that inserted the same key, even after that transaction deleted it, and
    goes through once it commits (its row is dead then)."""
    first, second, observer = await connect(), await connect(), await connect()
    await first.execute(f'CREATE SCHEMA "{schema}"')
    await first.execute(f'CREATE UNLOGGED TABLE "{schema}".g (k text PRIMARY KEY)')
    tx = first.transaction()
    await tx.start()
    await first.execute(f'INSERT INTO "{schema}".g VALUES ($1)', "x")
    await first.execute(f'DELETE FROM "{schema}".g WHERE k = $1', "x")
    inserting = asyncio.create_task(second.execute(
        f'INSERT INTO "{schema}".g VALUES ($1) ON CONFLICT DO NOTHING', "x"))
    await claim_waiting(observer, second, first)
    assert not inserting.done()
    await tx.commit()
    assert await asyncio.wait_for(inserting, 10) == "INSERT 0 1"


async def test_concurrent_copies_wait_for_the_first_claim_and_are_absorbed(
    connect: Connect, migrated: str,
) -> None:
    """A copy of a held batch's ids (UUIDs and other ids) in the same namespace waits for
    the first transaction and comes back duplicate; the same ids in another namespace are
    claimed at once, without waiting."""
    first, second, other, observer = (await connect(), await connect(), await connect(),
                                      await connect())
    store = PostgresDedupStore(migrated)
    tx = first.transaction(isolation="read_committed")
    await tx.start()
    assert [c.status for c in await store.claim_many(first, "billing", _requests(MIXED))] == [
        CLAIMED] * len(MIXED)
    copy = asyncio.create_task(_claim(store, second, "billing", [*reversed(MIXED), "fresh"]))
    await claim_waiting(observer, second, first)
    elsewhere = await asyncio.wait_for(_claim(store, other, "shipping", MIXED), 10)
    assert [c.status for c in elsewhere] == [CLAIMED] * len(MIXED)
    assert not copy.done()
    await tx.commit()
    claims = await asyncio.wait_for(copy, 10)
    assert [c.status for c in claims] == [DUPLICATE] * len(MIXED) + [CLAIMED]
    assert all(c.original_seen_at is not None for c in claims[:-1])
    # nothing stays behind in the guard
    assert await observer.fetchval(
        f'SELECT count(*) FROM "{migrated}".processed_events_guard') == 0


async def test_a_redelivery_with_another_record_time_is_caught(
    conn: Conn, migrated: str,
) -> None:
    store = PostgresDedupStore(migrated)
    now = datetime.now().astimezone()
    async with conn.transaction():
        first = await store.claim_many(conn, "billing", _requests(MIXED, now))
    async with conn.transaction():
        again = await store.claim_many(
            conn, "billing", _requests(MIXED, now - timedelta(minutes=5)))
    assert [c.status for c in first] == [CLAIMED] * len(MIXED)
    assert [c.status for c in again] == [DUPLICATE] * len(MIXED)


async def test_a_claim_of_500_ids_holds_as_many_lock_entries_as_a_claim_of_5(
    connect: Connect, migrated: str,
) -> None:
    """Counted from another connection while each claim's transaction is held open."""
    conn, observer = await connect(), await connect()
    store = PostgresDedupStore(migrated)
    held: dict[int, int] = {}
    await _claim(store, conn, "billing", ["warm-up"])  # the session's first call: no more
    for size in (5, 500):
        async with conn.transaction(isolation="read_committed"):
            await store.claim_many(conn, "billing", _requests([f"b{size}-{n}" for n in
                                                              range(size)]))
            held[size] = await _entries(observer, conn.get_server_pid())
    print(f"lock-table entries of one held claim: {held}")
    assert held[500] <= held[5] + 2
    assert held[500] <= ENTRIES_PER_CLAIM


async def test_twelve_connections_holding_claims_of_500_ids_stay_far_from_the_lock_table(
    connect: Connect, migrated: str,
) -> None:
    """Twelve connections stand in for twelve consumer processes: their claims are all that
    reaches the server, and twelve processes would take CI seconds to start. First each holds
    a transaction of three claims of 500 ids of its own (with the old per-id locks 18,000
    entries, beyond the 6,400 of a default server); then all claim overlapping batches at once
    and commit: every id claimed exactly once, the copies absorbed."""
    conns = [await connect() for _ in range(12)]
    observer = await connect()
    store = PostgresDedupStore(migrated)
    holding, release = asyncio.Semaphore(0), asyncio.Event()

    async def hold(n: int) -> None:
        async with conns[n].transaction(isolation="read_committed"):
            for batch in range(3):
                await store.claim_many(conns[n], "billing", _requests(
                    [f"own-{n}-{batch}-{i}" for i in range(500)]))
            holding.release()
            await release.wait()

    async def overlap(n: int) -> list[tuple[str, Claim]]:
        claimed: list[tuple[str, Claim]] = []
        for batch in range(3):
            # 500 ids of a pool of 1,000 per batch round, each id wanted by six connections
            ids = [f"pool-{batch}-{(n * 83 + i) % 1000}" for i in range(500)]
            async with conns[n].transaction(isolation="read_committed"):
                claims = await store.claim_many(conns[n], "billing", _requests(ids))
            claimed += zip(ids, claims, strict=True)
        return claimed

    peak = 0

    async def sample(until: asyncio.Future[Any]) -> None:
        nonlocal peak
        while not until.done():
            peak = max(peak, await _entries(observer))
            await asyncio.wait([until], timeout=0.02)

    async def all_holding() -> None:
        for _ in conns:
            await holding.acquire()

    holders: asyncio.Future[Any] = asyncio.gather(*(hold(n) for n in range(len(conns))))
    all_held: asyncio.Future[Any] = asyncio.create_task(all_holding())
    await asyncio.wait_for(asyncio.wait([all_held, holders],
                                        return_when=asyncio.FIRST_COMPLETED), 120)
    if holders.done():
        holders.result()  # an "out of shared memory" (or any error) surfaces here
    held_peak = await _entries(observer)
    release.set()
    await asyncio.wait_for(holders, 60)
    racing = asyncio.ensure_future(asyncio.gather(*(overlap(n) for n in range(len(conns)))))
    await asyncio.wait_for(sample(racing), 120)
    results = racing.result()
    print(f"lock-table entries: 12 connections holding 1,500 ids each {held_peak}; "
          f"peak while 12 race over shared ids {peak}")
    assert held_peak <= 12 * ENTRIES_PER_CLAIM
    assert peak <= 12 * ENTRIES_PER_CLAIM
    wins: dict[str, int] = {}
    for claimed in results:
        for event_id, claim in claimed:
            assert claim.status in (CLAIMED, DUPLICATE)
            wins[event_id] = wins.get(event_id, 0) + (claim.status is CLAIMED)
    assert len(wins) == 3 * 1000
    assert all(count == 1 for count in wins.values()), sorted(
        e for e, c in wins.items() if c != 1)[:5]


async def test_the_wait_ends_at_the_claim_lock_timeout_with_55P03(
    connect: Connect, migrated: str,
) -> None:
    first, second = await connect(), await connect()
    store = PostgresDedupStore(migrated, DedupPolicy(claim_lock_timeout=timedelta(
        milliseconds=300)))
    tx = first.transaction(isolation="read_committed")
    await tx.start()
    await store.claim_many(first, "billing", _requests(MIXED))
    try:
        with pytest.raises(asyncpg.LockNotAvailableError) as raised:
            await _claim(store, second, "billing", MIXED[1:2])
    finally:
        await tx.rollback()
    assert raised.value.sqlstate == "55P03"
    # the session's own lock_timeout is back once the wait is over
    assert await second.fetchval("SHOW lock_timeout") == "0"
