"""TestConsumer: the production engine, pipeline and dedup store, fed from memory, on a real
PostgreSQL; what it reports is what happened."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from consumerkit import (
    ConfigurationError,
    Consumer,
    HandlerContext,
    Limits,
    Postgres,
    RetryPolicy,
    Stall,
    handler,
)
from consumerkit.testing import Outcome, TestConsumer

from .handlers import TABLE_SQL, Step, Unhandled, effects, registry


async def create_table(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(TABLE_SQL)
    finally:
        await conn.close()


@pytest.fixture
async def kit(consumerkit_dsn: str, consumerkit_schema: str) -> AsyncIterator[TestConsumer]:
    await create_table(consumerkit_dsn)
    async with TestConsumer(
            [registry], postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema)) as kit:
        yield kit


async def test_each_event_applied_once_and_every_partition_committed(
    kit: TestConsumer, consumerkit_dsn: str,
) -> None:
    sent = [kit.publish(Step(key=f"k{n}", seq=n), key=f"k{n}") for n in range(12)]
    kit.redeliver(sent[3], sent[7])
    await kit.drain()
    assert sorted(s.event_id or "" for s in kit.applied) == sorted(
        dict(r.headers)["id"].decode() for r in sent)  # type: ignore[union-attr]
    assert [s.record.offset for s in kit.duplicates] != []
    assert {s.event_id for s in kit.duplicates} == {
        dict(sent[3].headers)["id"].decode(), dict(sent[7].headers)["id"].decode()}  # type: ignore[union-attr]
    assert sorted(await effects(consumerkit_dsn)) == sorted((f"k{n}", n) for n in range(12))
    ends = kit.broker.end_offsets("events")
    assert kit.committed == {p: end for p, end in ends.items() if end}
    assert len([p for p, end in ends.items() if end]) > 1  # keys spread over partitions
    assert kit.stats.applied == 12
    assert kit.stats.duplicates == 2


async def test_one_key_stays_on_one_partition_and_in_order(
    kit: TestConsumer, consumerkit_dsn: str,
) -> None:
    sent = [kit.publish(Step(key=k, seq=n), key=k) for n in range(30) for k in ("a", "b")]
    await kit.drain()
    for key in ("a", "b"):
        mine = [r for r in sent if r.key == key.encode()]
        assert len({r.partition for r in mine}) == 1
        offsets = [r.offset for r in mine]
        assert offsets == sorted(offsets)
        assert [seq for k, seq in await effects(consumerkit_dsn) if k == key] == list(range(30))


async def test_replay_from_the_start_changes_nothing(
    kit: TestConsumer, consumerkit_dsn: str,
) -> None:
    for n in range(5):
        kit.publish(Step(key="k", seq=n), key="k")
    await kit.drain()
    before = await effects(consumerkit_dsn)
    kit.replay(0)
    await kit.drain()
    assert len(kit.duplicates) == 5
    assert await effects(consumerkit_dsn) == before


async def test_with_offsets_in_postgres_replay_says_why_it_cannot_rewind(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    """The kit keeps offsets in its broker unless told otherwise; with offset_store="postgres"
    it stores them beside the effects as production does, and replay() (a rewind of the
    broker's offsets, which the stored rows would override) refuses in one line."""
    await create_table(consumerkit_dsn)
    async with TestConsumer(
            [registry], postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema)) as plain:
        assert plain.consumer.offset_store == "kafka"
    async with TestConsumer([registry],
                            postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                            name="stored", offset_store="postgres") as kit:
        for n in range(3):
            kit.publish(Step(key="k", seq=n), key="k")
        await kit.drain()
        conn = await asyncpg.connect(consumerkit_dsn)
        try:
            stored = await conn.fetchval(
                f'SELECT sum(next_offset) FROM "{consumerkit_schema}".consumer_offsets '
                "WHERE consumer_group = 'stored'")
        finally:
            await conn.close()
        assert stored == 3
        with pytest.raises(ConfigurationError, match="replay\\(\\) rewinds the broker's offsets"):
            kit.replay(0)


async def test_drain_raises_the_first_handler_error(kit: TestConsumer) -> None:
    kit.publish(Step(key="k", seq=1), key="k")
    kit.publish(Step(key="k", seq=2, fail="error"), key="k")
    with pytest.raises(ValueError, match="step 2 of k failed"):
        await kit.drain()


async def test_without_fail_fast_failures_are_retried_then_dead_lettered(
    kit: TestConsumer, consumerkit_dsn: str,
) -> None:
    kit.publish(Step(key="k", seq=1, fail="error"), key="k")
    kit.publish(Step(key="k", seq=2, fail="once"), key="k")
    kit.publish(Step(key="k", seq=3), key="k")
    await kit.drain(fail_fast=False)
    (entry,) = kit.dead_letters
    assert entry.reason == "handler_failed"
    assert entry.attempts == 3  # the kit's default retry policy
    assert len(kit.errors) == 4  # three attempts of seq 1, the first of seq 2
    assert await effects(consumerkit_dsn) == [("k", 2), ("k", 3)]  # seq 1 rolled back
    assert [s.outcome for s in kit.settled] == [
        Outcome.DEAD_LETTERED, Outcome.APPLIED, Outcome.APPLIED]


async def test_a_dead_letter_signal_is_no_error(kit: TestConsumer) -> None:
    kit.publish(Step(key="k", seq=1, fail="dead"), key="k")
    await kit.drain()
    assert [e.reason for e in kit.dead_letters] == ["dead_lettered_by_handler"]
    assert kit.errors == []


async def test_raw_records_go_through_the_decoder(kit: TestConsumer) -> None:
    kit.publish(b'{"key": "k", "seq": 1}', key="k",
                headers=[("id", b"raw-1"), ("event_type", b"step.done")])
    kit.publish(b"not json", key="k", headers=[("id", b"raw-2"), ("event_type", b"step.done")])
    await kit.drain()
    assert [s.event_id for s in kit.applied] == ["raw-1"]
    assert [(e.event_id, e.reason) for e in kit.dead_letters] == [("raw-2", "invalid_json")]


async def test_publish_refuses_what_no_handler_takes(kit: TestConsumer) -> None:
    with pytest.raises(ConfigurationError, match="pass event_type="):
        kit.publish(Unhandled(x=1))
    with pytest.raises(ConfigurationError, match="raw record"):
        kit.publish(b"{}", event_id="x")


async def test_settings_reach_the_consumer(consumerkit_dsn: str, consumerkit_schema: str) -> None:
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute(TABLE_SQL)
    finally:
        await conn.close()
    retry = RetryPolicy(max_attempts=1)
    async with TestConsumer([registry],
                            postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                            limits=Limits(max_batch=1),
                            retry=retry, topics=["steps"], partitions=2) as kit:
        kit.publish(Step(key="k", seq=1, fail="error"), key="k")
        await kit.drain(fail_fast=False)
        assert kit.consumer.retry is retry
        assert kit.broker.topics() == {"steps": 2}
        assert [e.attempts for e in kit.dead_letters] == [1]


async def test_a_failure_is_raised_by_one_drain_only(kit: TestConsumer) -> None:
    kit.publish(Step(key="k", seq=1, fail="error"), key="k")
    await kit.drain(fail_fast=False)  # dead-lettered: settled, not raised later
    kit.publish(Step(key="k", seq=2), key="k")
    await kit.drain()
    kit.publish(Step(key="j", seq=3, fail="error"), key="j")
    with pytest.raises(ValueError, match="step 3"):
        await kit.drain()
    assert len(kit.errors) >= 4


async def test_a_drain_that_times_out_on_a_stall_says_why(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    # no effects table: a failure every record would hit, which stalls; nothing dead-letters
    async with TestConsumer([registry],
                            postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                            stall=Stall(max_delay=0.2)) as kit:
        kit.publish(Step(key="k", seq=1), key="k")
        with pytest.raises(TimeoutError, match=r"the consumer is stalled: handler \S+apply_step "
                           r"cannot run: undefined_table: UndefinedTableError"):
            await kit.drain(fail_fast=False, timeout=5)
        assert kit.dead_letters == []
        assert kit.stats.stalls == 1
        conn = await asyncpg.connect(consumerkit_dsn)
        try:
            await conn.execute(TABLE_SQL)  # the migration comes: it resumes by itself
        finally:
            await conn.close()
        await kit.drain(fail_fast=False)
        assert [s.outcome for s in kit.settled] == [Outcome.APPLIED]
    assert await effects(consumerkit_dsn) == [("k", 1)]


def test_like_keeps_the_stall_settings() -> None:
    consumer = Consumer(name="billing", handlers=[registry], topics=["events"],
                        postgres=Postgres(dsn="postgresql://u@h/d"),
                        stall=Stall(after_keys=2, max_delay=3.0))
    kit = TestConsumer.like(consumer)
    assert (kit.consumer.stall_after_keys, kit.consumer.stall_max_delay) == (2, 3.0)


class Downstream:
    """A service every key needs: down, then back; it always refuses the poison key."""

    up = False


@handler("step.sent")
async def send_step(event: Step, ctx: HandlerContext) -> None:
    if event.key == "poison" or not Downstream.up:
        raise ConnectionError("400" if event.key == "poison" else "503")
    await ctx.tx.execute("INSERT INTO effects (key, seq) VALUES ($1, $2)", event.key, event.seq)


async def test_a_poison_record_probing_a_stall_does_not_hold_it(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    """The service goes down, and a poison record failing with the same error type as the
    outage completes the streak: it probes first. Once the service is back, another record's
    turn ends the stall; the poison record then dead-letters alone."""
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute(TABLE_SQL)
    finally:
        await conn.close()
    Downstream.up = False
    retry = RetryPolicy(max_attempts=8, initial_delay=0.05, max_delay=0.1)
    async with TestConsumer([send_step],
                            postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                            stall=Stall(after_keys=2, max_delay=0.2),
                            retry=retry) as kit:
        kit.publish(Step(key="k", seq=1), key="k", event_type="step.sent")
        async with asyncio.timeout(10):  # k has failed: one key of the streak
            while not kit.errors:
                await asyncio.sleep(0.01)
        kit.publish(Step(key="poison", seq=1), key="poison", event_type="step.sent")
        async with asyncio.timeout(10):  # the poison key completes it: a stall, it probes
            while not kit.stats.stalls:
                await asyncio.sleep(0.01)
        Downstream.up = True
        await kit.drain(fail_fast=False, timeout=20)
        assert [s.record.key for s in kit.applied] == [b"k"]
        assert [e.key for e in kit.dead_letters] == [b"poison"]
    assert await effects(consumerkit_dsn) == [("k", 1)]


@handler("step.kept")
async def keep_step(event: Step, ctx: HandlerContext) -> None:
    if event.key == "poison":  # refused before any statement: says nothing of the table
        raise ValueError("this step can never be kept")
    await ctx.tx.execute("INSERT INTO effects (key, seq) VALUES ($1, $2)", event.key, event.seq)


async def test_a_poison_record_tried_during_a_stall_does_not_end_it(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    """The effects table is missing: a stall. The poison record, in flight beside the others,
    fails for its own reason on each of its turns: it dead-letters alone, and the stall goes
    on (one stall, not one per turn) until the table comes."""
    retry = RetryPolicy(max_attempts=3, initial_delay=0.05, max_delay=0.1)
    async with TestConsumer([keep_step],
                            postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                            stall=Stall(max_delay=0.1),
                            retry=retry) as kit:
        for key in ("k1", "poison", "k2"):
            kit.publish(Step(key=key, seq=1), key=key, event_type="step.kept")
        async with asyncio.timeout(20):
            while not kit.dead_letters:
                await asyncio.sleep(0.01)
        assert [e.key for e in kit.dead_letters] == [b"poison"]
        assert kit.stats.stalls == 1
        assert kit.applied == []
        conn = await asyncpg.connect(consumerkit_dsn)
        try:
            await conn.execute(TABLE_SQL)  # the migration comes: it resumes by itself
        finally:
            await conn.close()
        await kit.drain(fail_fast=False, timeout=20)
        assert sorted(s.record.key or b"" for s in kit.applied) == [b"k1", b"k2"]
        assert kit.stats.stalls == 1
    assert sorted(await effects(consumerkit_dsn)) == [("k1", 1), ("k2", 1)]
