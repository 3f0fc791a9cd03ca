"""The expired policy, database outages, namespaces, handler signals, start-up warnings."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial

import asyncpg
import pytest

from consumerkit import (
    DeadLetter,
    DedupPolicy,
    HandlerContext,
    Limits,
    Retry,
    RetryPolicy,
)
from consumerkit.deadletter.table import list_dead_letters
from consumerkit.dedup.policy import ExpiredPolicy
from consumerkit.testing.services import MakeTopic

from .conftest import LedgerTopic
from .ledger import (
    Event,
    Running,
    Step,
    build,
    ledger_rows,
    make_events,
    publish,
    settled,
    verify,
    wait_for,
)

Hook = Callable[[Step, HandlerContext], Awaitable[None]]



@pytest.mark.parametrize("policy", ["dead_letter", "skip", "apply"])
async def test_events_older_than_the_window_follow_the_expired_policy(
    policy: ExpiredPolicy, postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic,
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=1)
    old = (datetime.now(UTC) - timedelta(days=3)).isoformat().encode()
    stale = [Event(f"old-{n}", "k", n + 1, headers=(("occurred_at", old),)) for n in range(3)]
    fresh = [Event("new-1", "j", 1)]
    await publish(kafka_bootstrap, topic, [*stale, *fresh])
    window = DedupPolicy(retention=timedelta(days=2), expired=policy)
    consumer = build("late", pg_schema, topic, postgres_dsn, kafka_bootstrap, dedup=window)
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, 4), 60, "every record settled")
    async with pg_pool.acquire() as conn:
        applied = {r["event_id"] for r in await ledger_rows(conn, pg_schema)}
        letters = await list_dead_letters(conn, pg_schema)
    if policy == "apply":
        assert applied == {"old-0", "old-1", "old-2", "new-1"}
        assert letters == []
    elif policy == "skip":
        assert applied == {"new-1"}
        assert consumer.stats.expired_skipped == 3
        assert letters == []
    else:
        assert applied == {"new-1"}
        assert sorted(x.event_id or "" for x in letters) == ["old-0", "old-1", "old-2"]
        assert {x.reason for x in letters} == {"expired"}


async def test_terminated_database_connections_are_waited_out_not_dead_lettered(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=2)
    events = make_events(keys=10, per_key=30)
    await publish(kafka_bootstrap, topic, events)
    # one attempt only: a terminated connection mistaken for a handler failure dead-letters
    consumer = build("outage", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     limits=Limits(concurrency=4),
                     retry=RetryPolicy(max_attempts=1, initial_delay=0.01, max_delay=0.05))
    kills = 0
    async with Running(consumer):
        for round_ in range(1, 6):  # kill the consumer's connections, then let it progress
            kills += await pg_pool.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = $1 AND pid <> pg_backend_pid()",
                f"consumerkit:{consumer.name}"[:63])
            target = min(len(events), round_ * 40)
            await wait_for(partial(settled, consumer, target), 60, f"{target} settled")
        await wait_for(lambda: settled(consumer, len(events)), 120, "every event applied")
    assert kills > 0, "the test must actually kill connections"
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
        assert await list_dead_letters(conn, pg_schema) == []


async def test_each_consumer_name_is_its_own_dedup_namespace(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=2)
    events = make_events(keys=5, per_key=10)
    await publish(kafka_bootstrap, topic, [*events, *events[:10]])
    billing = build("billing", pg_schema, topic, postgres_dsn, kafka_bootstrap)
    inventory = build("inventory", pg_schema, topic, postgres_dsn, kafka_bootstrap)
    async with Running(billing), Running(inventory):
        await wait_for(lambda: settled(billing, 60), 60, "billing settled")
        await wait_for(lambda: settled(inventory, 60), 60, "inventory settled")
    async with pg_pool.acquire() as conn:
        counts = Counter(r["event_id"] for r in await ledger_rows(conn, pg_schema))
    assert set(counts.values()) == {2}, "applied once per consumer, whatever the deliveries"
    assert len(counts) == len(events)
    assert billing.stats.duplicates == inventory.stats.duplicates == 10


async def test_handler_signals_retry_after_a_delay_and_dead_letter_at_once(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=1)
    calls: Counter[int] = Counter()

    async def signal(event: Step, ctx: HandlerContext) -> None:
        calls[event.seq] += 1
        if event.seq == 1 and ctx.attempt == 1:
            raise Retry(delay=0.01, reason="not yet")
        if event.seq == 2:
            raise DeadLetter("order references an unknown customer")

    events = make_events(keys=1, per_key=3)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("signals", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=signal)
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, 3), 60, "every record settled")
    assert calls == {1: 2, 2: 1, 3: 1}  # DeadLetter is not retried
    async with pg_pool.acquire() as conn:
        letters = await list_dead_letters(conn, pg_schema)
        applied = [r["seq"] for r in await ledger_rows(conn, pg_schema)]
    assert applied == [1, 3]
    assert [(x.reason, x.attempts) for x in letters] == [("dead_lettered_by_handler", 1)]
    assert "unknown customer" in letters[0].detail


async def test_synchronous_commit_off_is_warned_about(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await make_topic(partitions=1)
    dsn = postgres_dsn + ("&" if "?" in postgres_dsn else "?") + "synchronous_commit=off"
    consumer = build("unsafe", pg_schema, topic, dsn, kafka_bootstrap)
    with caplog.at_level(logging.WARNING, logger="consumerkit"):
        async with Running(consumer):
            pass
    assert any("synchronous_commit=off" in r.getMessage() for r in caplog.records)


async def test_stop_before_run_and_twice_is_harmless(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
) -> None:
    topic = await make_topic(partitions=1)
    consumer = build("early", pg_schema, topic, postgres_dsn, kafka_bootstrap)
    await consumer.stop()
    await asyncio.wait_for(consumer.run(), 60)  # a stop requested before run() ends it at once
    await consumer.stop()


async def test_a_swallowed_database_error_is_retried_never_silently_lost(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    """A handler that catches a database error and returns leaves its transaction aborted:
    COMMIT would roll back without a word. The pipeline notices, and retries the event."""
    topic = await ledger_topic(partitions=1)

    async def swallow(event: Step, ctx: HandlerContext) -> None:
        if ctx.attempt == 1:  # the mistake: swallowing leaves the transaction aborted
            with contextlib.suppress(asyncpg.DivisionByZeroError):
                await ctx.tx.execute("SELECT 1 / 0")

    events = make_events(keys=1, per_key=2)
    await publish(kafka_bootstrap, topic, events)
    # the database's default isolation is stricter; the consumer pins READ COMMITTED
    dsn = postgres_dsn + ("&" if "?" in postgres_dsn else "?") + (
        "default_transaction_isolation=serializable")
    consumer = build("swallow", pg_schema, topic, dsn, kafka_bootstrap, fail=swallow)
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, 2), 60, "both events settled")
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
    assert consumer.stats.applied == 2
    assert consumer.stats.retries == 2


async def test_a_handler_leaving_a_query_running_fails_and_is_dead_lettered(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    """A query started on ctx.tx but not awaited is a handler bug, not a database outage:
    the attempts are spent and the record ends in the dead letters instead of looping."""
    topic = await ledger_topic(partitions=1)
    strays: list[asyncio.Task[str]] = []

    async def stray(event: Step, ctx: HandlerContext) -> None:
        if event.seq == 1:
            strays.append(asyncio.ensure_future(ctx.tx.execute("SELECT pg_sleep(0.05)")))
            await asyncio.sleep(0)  # let it start: the connection is now busy

    events = make_events(keys=1, per_key=2)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("stray", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=stray)
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, 2), 60, "both records settled")
    await asyncio.gather(*strays, return_exceptions=True)
    async with pg_pool.acquire() as conn:
        letters = await list_dead_letters(conn, pg_schema)
        applied = [r["seq"] for r in await ledger_rows(conn, pg_schema)]
    assert [(x.event_id, x.reason, x.attempts) for x in letters] == [
        ("evt-0-1", "handler_failed", 4)]
    assert applied == [2]


async def test_a_missing_dedup_partition_is_recreated_and_nothing_is_dead_lettered(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    """Someone dropped the partitions the consumer writes to: claims fail for want of a
    partition, the consumer runs maintenance at once and the records go through."""
    topic = await ledger_topic(partitions=1)
    first = make_events(keys=1, per_key=1, prefix="before")
    await publish(kafka_bootstrap, topic, first)
    consumer = build("heal", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     maintenance_interval=timedelta(hours=1))
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, 1), 60, "the first record")
        parts = await pg_pool.fetch(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent JOIN pg_namespace n "
            "ON n.oid = p.relnamespace WHERE n.nspname = $1 AND p.relname = 'processed_events'",
            pg_schema)
        for part in parts:
            await pg_pool.execute(f'DROP TABLE "{pg_schema}"."{part["relname"]}"')
        later = make_events(keys=2, per_key=3, prefix="after")
        await publish(kafka_bootstrap, topic, later)
        await wait_for(lambda: settled(consumer, 1 + len(later)), 60, "the later records")
    async with pg_pool.acquire() as conn:
        assert await list_dead_letters(conn, pg_schema) == []
        applied = {r["event_id"] for r in await ledger_rows(conn, pg_schema)}
    assert applied == {e.event_id for e in [*first, *later]}
    assert consumer.stats.retries == 0  # waited out as an outage, no attempt spent
