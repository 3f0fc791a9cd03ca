"""A stall told from poison: records whose data breaks a constraint, or that a handler refuses
on many keys, are dead-lettered after their attempts while the good records behind them are
applied; a service down for every key stays a stall even for new records; errors that are
nobody's record (the server out of resources, a statement cancelled at shutdown) are waited
out, never dead-lettered."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import asyncpg
import pytest

from consumerkit import Consumer, HandlerContext, Limits, RetryPolicy, Stall, Timeouts
from consumerkit.shared.identifiers import identifier
from consumerkit.testing.services import MakeTopic

from .ledger import (
    Event,
    Running,
    Step,
    build,
    create_ledger,
    engine_of,
    ledger_rows,
    make_events,
    publish,
    settled,
    verify,
    wait_for,
)
from .test_failures import dead_letters

FAST = RetryPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.05)


def bad_events(count: int) -> list[Event]:
    """One event on each of ``count`` keys of their own."""
    return [Event(f"bad-{i}", f"bad-{i}", 1) for i in range(count)]


async def stalled(consumer: Consumer) -> bool:
    return (await consumer.readiness() or "").startswith("stalled: ")


async def true(condition: bool) -> bool:
    return condition


async def prepare(pool: asyncpg.Pool, schema: str) -> None:
    async with pool.acquire() as conn:
        await create_ledger(conn, schema)
        await conn.execute(f"CREATE TABLE {identifier(schema)}.items "
                           "(id text PRIMARY KEY, n int NOT NULL CHECK (n >= 0))")


@pytest.mark.parametrize(("bad", "error", "max_batch"), [
    (6, "CheckViolationError", 1),
    (6, "CheckViolationError", 500),
    (60, "CheckViolationError", 500),
    (6, "CharacterNotInRepertoireError", 500),
], ids=["6-check-one-by-one", "6-check-batches", "60-check", "6-nul-byte"])
async def test_records_whose_data_the_database_refuses_are_dead_lettered_never_a_stall(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, bad: int, error: str, max_batch: int,
) -> None:
    topic = await make_topic(partitions=2)
    await prepare(pg_pool, pg_schema)
    s = identifier(pg_schema)
    failed: set[str] = set()

    async def items(event: Step, ctx: HandlerContext) -> None:
        if not event.key.startswith("bad-"):
            return
        failed.add(event.key)  # the statement below always fails
        if error == "CheckViolationError":
            await ctx.tx.execute(f"INSERT INTO {s}.items VALUES ($1, -1)", event.key)
        else:  # text PostgreSQL cannot store: CharacterNotInRepertoireError (22021)
            await ctx.tx.execute(f"INSERT INTO {s}.items VALUES ($1, 1)", event.key + "\x00")

    poison = bad_events(bad)
    await publish(kafka_bootstrap, topic, poison)
    consumer = build("data", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=items,
                     retry=FAST,
                     limits=Limits(max_batch=max_batch),
                     stall=Stall(max_delay=0.5))
    good = make_events(keys=4, per_key=3, prefix="good")
    async with Running(consumer):
        # more keys than stall_after_keys (5) failed: today's rule would stall here
        await wait_for(lambda: true(len(failed) >= 6), 60, "the bad records to fail")
        await publish(kafka_bootstrap, topic, good)
        await wait_for(lambda: settled(consumer, bad + len(good)), 60,
                       "every record applied or dead-lettered")
        assert consumer.stats.stalls == 0
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), good)
    letters = await dead_letters(pg_pool, pg_schema)
    assert {x.event_id for x in letters} == {e.event_id for e in poison}
    assert len(letters) == len(poison)
    assert all(x.reason == "handler_failed" and error in x.detail
               and "gave up after 3 attempts" in x.detail for x in letters), letters[0]


async def test_a_handler_refusing_many_keys_stalls_until_a_new_record_passes(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(partitions=2)
    async with pg_pool.acquire() as conn:
        await create_ledger(conn, pg_schema)

    poison = bad_events(4)
    seen: set[str] = set()
    all_seen = asyncio.Event()

    async def refuse(event: Step, ctx: HandlerContext) -> None:
        if event.key.startswith("bad-"):
            # the first failures of the four keys happen together, as a service's would: a
            # record fetched first must not spend its three attempts before the others are
            # fetched (the streak needs three keys; a lone key's attempts are its own)
            seen.add(event.key)
            if len(seen) == len(poison):
                all_seen.set()
            await asyncio.wait_for(all_seen.wait(), 30)
            raise ValueError("this amount can never be booked")

    await publish(kafka_bootstrap, topic, poison)
    consumer = build("refuse", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=refuse,
                     retry=FAST,
                     limits=Limits(max_batch=1),
                     stall=Stall(after_keys=3, max_delay=0.3))
    good = make_events(keys=3, per_key=2, prefix="good")
    async with Running(consumer):
        # 4 keys failing alike look like a service down: a stall, nothing dead-lettered
        await wait_for(lambda: stalled(consumer), 60, "the stall")
        assert consumer.stats.dead_lettered == 0
        # good records produced after it are taken, one gets through: each bad one alone
        await publish(kafka_bootstrap, topic, good)
        await wait_for(lambda: settled(consumer, len(poison) + len(good)), 60,
                       "every record applied or dead-lettered")
        assert not await stalled(consumer)
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), good)
    letters = await dead_letters(pg_pool, pg_schema)
    assert {x.event_id for x in letters} == {e.event_id for e in poison}
    assert len(letters) == len(poison)
    assert all("gave up after 3 attempts: ValueError" in x.detail for x in letters)


async def test_a_service_down_for_every_key_stays_a_stall_for_new_records_too(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(partitions=2)
    async with pg_pool.acquire() as conn:
        await create_ledger(conn, pg_schema)
    down = asyncio.Event()
    down.set()
    calls: Counter[str] = Counter()

    async def payments(event: Step, ctx: HandlerContext) -> None:
        calls[event.key] += 1
        if down.is_set():
            raise ConnectionRefusedError("the payment service refuses connections")

    first = make_events(keys=4, per_key=2)
    await publish(kafka_bootstrap, topic, first)
    consumer = build("alldown", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=payments,
                     retry=RetryPolicy(max_attempts=3, initial_delay=0.2, max_delay=0.5),
                     stall=Stall(after_keys=3, max_delay=0.3))
    later = [Event(f"new-{k}", f"new-{k}", 1) for k in range(3)]  # keys not yet seen
    async with Running(consumer):
        await wait_for(lambda: stalled(consumer), 60, "the stall")
        # every waiting record has tried: new records come, try, and fail alike
        await publish(kafka_bootstrap, topic, later)
        await wait_for(lambda: true(all(calls[e.key] >= 4 for e in later)), 60,
                       "the new records to try past their max_attempts")
        assert await stalled(consumer)
        assert consumer.stats.dead_lettered == 0
        down.clear()  # the service is back
        await wait_for(lambda: settled(consumer, len(first) + len(later)), 60,
                       "every event settled")
        assert not await stalled(consumer)
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), first + later)
    assert await dead_letters(pg_pool, pg_schema) == []


async def test_a_revoked_grant_holds_new_records_back_until_it_is_given_again(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(partitions=2)
    await prepare(pg_pool, pg_schema)
    s = identifier(pg_schema)
    role = identifier(f"ck_app_{uuid.uuid4().hex[:8]}")
    await pg_pool.execute(f"CREATE ROLE {role}")
    await pg_pool.execute(f"GRANT USAGE ON SCHEMA {s} TO {role}")  # no INSERT on items
    calls: Counter[str] = Counter()

    async def as_app(event: Step, ctx: HandlerContext) -> None:
        calls[event.key] += 1
        await ctx.tx.execute(f"SET LOCAL ROLE {role}")  # the handler's statements, as the app
        await ctx.tx.execute(f"INSERT INTO {s}.items VALUES ($1, $2)", ctx.envelope.event_id,
                             event.seq)
        await ctx.tx.execute("RESET ROLE")

    first = make_events(keys=4, per_key=2)
    await publish(kafka_bootstrap, topic, first)
    consumer = build("grant", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=as_app,
                     retry=FAST,
                     stall=Stall(max_delay=0.2))
    later = [Event(f"new-{k}", f"new-{k}", 1) for k in range(3)]
    try:
        async with Running(consumer):
            await wait_for(lambda: stalled(consumer), 60, "the stall")
            assert "insufficient_privilege" in (await consumer.readiness() or "")
            await publish(kafka_bootstrap, topic, later)
            tried = sum(calls.values())  # every waiting record probes, many times over
            await wait_for(lambda: true(sum(calls.values()) >= tried + 12), 60, "probes")
            assert not any(calls[e.key] for e in later)  # new records stayed on the broker
            assert consumer.stats.dead_lettered == 0
            await pg_pool.execute(f"GRANT INSERT ON {s}.items TO {role}")
            await wait_for(lambda: settled(consumer, len(first) + len(later)), 60,
                           "every event settled")
            assert not await stalled(consumer)
    finally:
        await pg_pool.execute(f"DROP OWNED BY {role}")
        await pg_pool.execute(f"DROP ROLE {role}")
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), first + later)
    assert await dead_letters(pg_pool, pg_schema) == []


@pytest.mark.parametrize("sqlstate", ["53200", "53300", "53400"])
async def test_the_server_out_of_resources_is_waited_out_not_dead_lettered(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, sqlstate: str,
) -> None:
    topic = await make_topic(partitions=1)
    async with pg_pool.acquire() as conn:
        await create_ledger(conn, pg_schema)
    refused = 0

    async def scarce(event: Step, ctx: HandlerContext) -> None:
        nonlocal refused
        if refused < 3:  # what PostgreSQL answers with its lock table or slots full
            refused += 1
            await ctx.tx.execute(
                "DO $$ BEGIN RAISE EXCEPTION 'out of shared memory' "
                f"USING ERRCODE = '{sqlstate}'; END $$")

    events = make_events(keys=1, per_key=2)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("scarce", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=scarce,
                     retry=RetryPolicy(max_attempts=1, initial_delay=0.01, max_delay=0.05))
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, len(events)), 60, "every event settled")
    assert refused == 3
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
    assert await dead_letters(pg_pool, pg_schema) == []
    assert consumer.stats.retries == 0  # no attempt spent: the server's trouble


async def test_a_statement_cancelled_at_shutdown_is_no_handler_failure(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(partitions=1)
    async with pg_pool.acquire() as conn:
        await create_ledger(conn, pg_schema)
    backend = asyncio.get_running_loop().create_future()
    raised: list[BaseException] = []

    async def slow(event: Step, ctx: HandlerContext) -> None:
        if not backend.done():
            backend.set_result(await ctx.tx.fetchval("SELECT pg_backend_pid()"))
            try:
                await ctx.tx.execute("SELECT pg_sleep(60)")
            except BaseException as exc:
                raised.append(exc)
                raise

    events = make_events(keys=1, per_key=1)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("cancel", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=slow,
                     retry=RetryPolicy(max_attempts=1, initial_delay=0.01, max_delay=0.05),
                     limits=Limits(max_batch=1),
                     timeouts=Timeouts(shutdown=30.0))  # a batch's failure abandons it
    async with Running(consumer):
        pid = await asyncio.wait_for(backend, 60)
        stopping = asyncio.create_task(consumer.stop())
        engine = engine_of(consumer)
        assert engine is not None
        await wait_for(lambda: true(all(s.abandon.is_set() for s in engine.states.values())),
                       30, "the stop to abandon the partition's work")
        async with pg_pool.acquire() as conn:  # the statement is cancelled (57014)
            assert await conn.fetchval("SELECT pg_cancel_backend($1)", pid)
        await asyncio.wait_for(stopping, 30)
    assert [type(e) for e in raised] == [asyncpg.QueryCanceledError]
    assert await dead_letters(pg_pool, pg_schema) == []
    assert consumer.stats.dead_lettered == consumer.stats.applied == consumer.stats.retries == 0
    assert consumer.stats.abandoned == 1  # left uncommitted, for the next run or owner
