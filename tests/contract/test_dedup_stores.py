"""The dedup contract, checked on every store: partitioned and table layouts, in-memory, and
the partitioned store behind each cache (Redis, the process's memory)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import asyncpg
import pytest

from consumerkit.dedup.redis import RedisDedupCache
from consumerkit.types import Claim, ClaimStatus

from .conftest import NAMESPACE, RETENTION, SKEW, Conn, Connect, Subject, envelope

CLAIMED, DUPLICATE, EXPIRED = ClaimStatus.CLAIMED, ClaimStatus.DUPLICATE, ClaimStatus.EXPIRED
DAY = timedelta(days=1)


def statuses(claims: list[Claim]) -> list[ClaimStatus]:
    return [c.status for c in claims]


async def test_a_duplicate_is_detected(subject: Subject, conn: Conn) -> None:
    assert await subject.claim(conn, envelope("e-1")) == [Claim(CLAIMED)]
    first_seen = await subject.seen(conn, "e-1")
    assert first_seen is not None

    again = await subject.claim(conn, envelope("e-1", offset=8))
    assert statuses(again) == [DUPLICATE]
    if subject.cache is None:
        assert again[0].original_seen_at == first_seen
    else:  # answered by the cache, before any transaction
        assert (subject.cache.hits, subject.cache.misses) == (1, 1)
    assert await subject.seen(conn, "e-1") == first_seen


async def test_duplicates_within_one_batch(subject: Subject, conn: Conn) -> None:
    now = datetime.now().astimezone()
    old = now - RETENTION - DAY
    claims = await subject.claim(
        conn, envelope("a"), envelope("b"), envelope("a", offset=9),
        envelope("o", old), envelope("o", now), envelope("p", now), envelope("p", old))
    assert statuses(claims) == [CLAIMED, CLAIMED, DUPLICATE, EXPIRED, CLAIMED, CLAIMED, EXPIRED]
    # the original is in the same batch: applied now, in this transaction
    assert claims[2].original_seen_at is not None
    assert claims[2].original_seen_at >= now

    seen = {i: await subject.seen(conn, i) for i in "abop"}
    assert None not in seen.values()
    again = await subject.claim(conn, envelope("a"), envelope("o", old), envelope("p", old))
    assert statuses(again) == [DUPLICATE] * 3
    if subject.cache is None:
        assert [c.original_seen_at for c in again] == [seen["a"], seen["o"], seen["p"]]


async def test_a_second_claim_in_the_same_transaction_is_a_duplicate(
    subject: Subject, conn: Conn,
) -> None:
    opened = await subject.begin(conn, [envelope("q")])
    assert statuses(opened.claims) == [CLAIMED]
    later = await subject.store.claim_many(conn, NAMESPACE, opened.requests)
    assert statuses(later) == [DUPLICATE]
    assert later[0].original_seen_at is not None
    await opened.end(commit=True)
    assert await subject.seen(conn, "q") == later[0].original_seen_at


async def test_a_rollback_leaves_no_trace(subject: Subject, conn: Conn) -> None:
    assert statuses(await subject.claim(conn, envelope("r-1"), commit=False)) == [CLAIMED]
    assert await subject.seen(conn, "r-1") is None
    if subject.cache is not None:
        assert await subject.cache.known(NAMESPACE, ["r-1"]) == set()
    assert statuses(await subject.claim(conn, envelope("r-1"))) == [CLAIMED]
    assert await subject.seen(conn, "r-1") is not None


@pytest.mark.parametrize(("first_commits", "second_sees"),
                         [(True, DUPLICATE), (False, CLAIMED)], ids=["commit", "rollback"])
async def test_a_concurrent_duplicate_waits_for_the_first_transaction(
    subject: Subject, connect: Connect, first_commits: bool, second_sees: ClaimStatus,
) -> None:
    owner, zombie, observer = await connect(), await connect(), await connect()
    opened = await subject.begin(owner, [envelope("c-1"), envelope("c-2")])
    assert statuses(opened.claims) == [CLAIMED, CLAIMED]

    # the other owner's batch shares c-2 and has an id of its own
    second = asyncio.create_task(
        subject.claim(zombie, envelope("c-3"), envelope("c-2", offset=9)))
    await subject.wait_until_blocked(observer, zombie)
    assert not second.done()

    await opened.end(commit=first_commits)
    result = await asyncio.wait_for(second, timeout=10)
    assert statuses(result) == [CLAIMED, second_sees]
    seen = await subject.seen(observer, "c-2")
    assert seen is not None
    if first_commits:
        assert result[1].original_seen_at == seen
    else:
        assert await subject.seen(observer, "c-1") is None


async def test_a_holder_that_never_ends_blocks_a_claim_only_for_the_lock_timeout(
    subject: Subject, connect: Connect,
) -> None:
    holder, other = await connect(), await connect()
    opened = await subject.begin(holder, [envelope("t-1")])
    try:
        impatient = subject.impatient(timedelta(milliseconds=200))
        tx = other.transaction(isolation="read_committed")
        await tx.start()
        try:
            with pytest.raises(asyncpg.LockNotAvailableError):
                await asyncio.wait_for(impatient.claim_many(
                    other, NAMESPACE, opened.requests), timeout=10)
        finally:
            await tx.rollback()
    finally:
        await opened.end(commit=False)
    assert statuses(await subject.claim(other, envelope("t-1"))) == [CLAIMED]


async def test_events_older_than_the_retention_are_expired_unless_the_window_is_off(
    subject: Subject, conn: Conn,
) -> None:
    now = datetime.now().astimezone()
    old = envelope("x-1", now - RETENTION - DAY)
    assert await subject.claim(conn, old) == [Claim(EXPIRED)]
    assert await subject.seen(conn, "x-1") is None
    recent = envelope("x-2", now - RETENTION + DAY)
    assert statuses(await subject.claim(conn, recent)) == [CLAIMED]
    assert statuses(await subject.claim(conn, old, enforce_window=False)) == [CLAIMED]
    assert statuses(await subject.claim(conn, old)) == [DUPLICATE]


async def test_rows_are_kept_for_the_retention_and_removed_after_it(
    subject: Subject, conn: Conn,
) -> None:
    assert statuses(await subject.claim(conn, envelope("k-1"))) == [CLAIMED]
    now = datetime.now().astimezone()

    await subject.retire(conn, now + RETENTION - DAY)
    assert await subject.seen(conn, "k-1") is not None

    await subject.retire(conn, now + RETENTION + SKEW + 2 * DAY)
    assert await subject.seen(conn, "k-1") is None
    if subject.cache is not None:  # the cache forgets on its own, no later than the table
        assert subject.cache.ttl <= RETENTION
        if isinstance(subject.cache, RedisDedupCache):
            key = subject.cache.key(NAMESPACE, "k-1")
            ttl = await _pttl(subject.cache.url, key)
            assert 0 < ttl <= RETENTION / timedelta(milliseconds=1)
    else:
        assert statuses(await subject.claim(conn, envelope("k-1"))) == [CLAIMED]


async def test_namespaces_are_isolated(subject: Subject, conn: Conn) -> None:
    assert statuses(await subject.claim(conn, envelope("n-1"))) == [CLAIMED]
    assert statuses(await subject.claim(conn, envelope("n-1"), namespace="shipping")) == [
        CLAIMED]
    assert statuses(await subject.claim(conn, envelope("n-1"), namespace="shipping")) == [
        DUPLICATE]
    assert await subject.seen(conn, "n-1", "inventory") is None
    assert statuses(await subject.claim(conn, envelope("n-1"))) == [DUPLICATE]


async def _pttl(url: str, key: bytes) -> int:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(url)
    try:
        return int(await client.pttl(key))
    finally:
        await client.aclose()
