"""The bulk claim under concurrency: sorted guard entries, a fresh snapshot after the last
wait, and the verdicts of a batch that waited for another one."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime

import asyncpg

from consumerkit.dedup import PostgresDedupStore
from consumerkit.envelope import Envelope
from consumerkit.types import Claim, ClaimRequest, ClaimStatus

from .claim_waits import claim_waiting
from .conftest import Conn, Connect
from .dedup_rows import count_ids

NAMESPACE = "billing"
CLAIMED, DUPLICATE = ClaimStatus.CLAIMED, ClaimStatus.DUPLICATE


def _requests(*event_ids: str) -> list[ClaimRequest]:
    now = datetime.now().astimezone()
    return [ClaimRequest(Envelope(
        event_id=e, id_source="header", event_type="order.created", key="k", topic="orders",
        partition=0, offset=n, timestamp=now), "charge") for n, e in enumerate(event_ids)]


async def _claim(store: PostgresDedupStore, conn: Conn, *event_ids: str) -> list[Claim]:
    async with conn.transaction(isolation="read_committed"):
        return await store.claim_many(conn, NAMESPACE, _requests(*event_ids))


async def test_a_batch_blocked_on_its_last_id_sees_the_commit_that_released_it(
    connect: Connect, migrated: str,
) -> None:
    """The second batch enters its ids in the guard in sorted order and waits on the LAST
    one, held by the first batch; the look-up that follows runs after that wait and must see
    the first batch's commit (the function's later statement takes a fresh snapshot)."""
    first, second, observer = await connect(), await connect(), await connect()
    store = PostgresDedupStore(migrated)
    ids = [f"id-{n}" for n in range(8)]
    last = max(ids)

    tx = first.transaction(isolation="read_committed")
    await tx.start()
    assert [c.status for c in await store.claim_many(first, NAMESPACE, _requests(last))] == [
        CLAIMED]
    others = [e for e in ids if e != last]
    waiting = asyncio.create_task(_claim(store, second, *reversed(ids)))
    await claim_waiting(observer, second, first)
    await tx.commit()

    claims = await asyncio.wait_for(waiting, 10)
    verdicts = dict(zip(reversed(ids), claims, strict=True))
    assert verdicts[last].status is DUPLICATE
    assert verdicts[last].original_seen_at == await store.seen(observer, NAMESPACE, last)
    assert all(verdicts[e].status is CLAIMED for e in others)
    assert await count_ids(observer, migrated, namespace=NAMESPACE) == len(ids)


async def test_a_batch_whose_first_holder_rolls_back_claims_everything(
    connect: Connect, migrated: str,
) -> None:
    first, second, observer = await connect(), await connect(), await connect()
    store = PostgresDedupStore(migrated)
    tx = first.transaction(isolation="read_committed")
    await tx.start()
    await store.claim_many(first, NAMESPACE, _requests("r-1", "r-2"))
    waiting = asyncio.create_task(_claim(store, second, "r-3", "r-2", "r-1"))
    await claim_waiting(observer, second, first)
    await tx.rollback()
    assert [c.status for c in await asyncio.wait_for(waiting, 10)] == [CLAIMED] * 3


async def test_overlapping_batches_in_any_order_never_deadlock_and_claim_each_id_once(
    connect: Connect, migrated: str,
) -> None:
    """Many rounds of two batches over the same ids in opposite orders, each holding its
    transaction open a little after the claim: no deadlock, and every id claimed once."""
    a, b = await connect(), await connect()
    store = PostgresDedupStore(migrated)
    rng = random.Random(11)
    won: dict[str, int] = {}

    async def batch(conn: Conn, ids: list[str]) -> list[Claim]:
        async with conn.transaction(isolation="read_committed"):
            claims = await store.claim_many(conn, NAMESPACE, _requests(*ids))
            await conn.execute("SELECT pg_sleep(0.005)")
        return claims

    for round_ in range(20):
        ids = [f"o-{round_}-{n}" for n in range(30)]
        left = rng.sample(ids, 20)
        right = list(reversed(rng.sample(ids, 20)))
        try:
            results = await asyncio.wait_for(
                asyncio.gather(batch(a, left), batch(b, right)), 30)
        except asyncpg.DeadlockDetectedError as exc:
            raise AssertionError(f"round {round_}: overlapping batches deadlocked") from exc
        for chosen, claims in zip((left, right), results, strict=True):
            for event_id, claim in zip(chosen, claims, strict=True):
                if claim.status is CLAIMED:
                    won[event_id] = won.get(event_id, 0) + 1
                else:
                    assert claim.status is DUPLICATE
        assert all(won[e] == 1 for e in set(left) | set(right))
