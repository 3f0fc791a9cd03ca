"""``offset_store="postgres"`` on a real broker and a real PostgreSQL: offsets stored in the
effects' transactions, restarts that trust the database, and a database that moves back."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from prometheus_client import CollectorRegistry

from consumerkit import Consumer, HandlerContext, Limits

from .conftest import LedgerTopic
from .ledger import (
    Event,
    Running,
    Step,
    build,
    group,
    ledger_handler,
    ledger_rows,
    make_events,
    publish,
    publish_raw,
    verify,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]


async def stored(pool: asyncpg.Pool, schema: str, name: str) -> dict[int, int]:
    rows = await pool.fetch(
        f'SELECT "partition", next_offset FROM "{schema}".consumer_offsets '
        "WHERE consumer_group = $1", name)
    return {row["partition"]: row["next_offset"] for row in rows}


async def committed(bootstrap: str, name: str, topic: str, partitions: int) -> dict[int, int]:
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=name,
                             enable_auto_commit=False)
    await probe.start()
    try:
        found = {p: await probe.committed(TopicPartition(topic, p)) for p in range(partitions)}
    finally:
        await probe.stop()
    return {p: off for p, off in found.items() if off is not None}


async def applied(pool: asyncpg.Pool, schema: str) -> int:
    value = await pool.fetchval(f'SELECT count(*) FROM "{schema}".ledger')
    assert isinstance(value, int)
    return value


async def rows(pool: asyncpg.Pool, schema: str) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return await ledger_rows(conn, schema)


Rows = dict[int, tuple[int, int]]


async def snapshot(pool: asyncpg.Pool, schema: str, name: str) -> tuple[datetime, Rows]:
    """The moment, and the group's offset rows then: (next offset, commits) per partition."""
    async with pool.acquire() as conn:
        since = await conn.fetchval("SELECT clock_timestamp()")
        rows = await conn.fetch(
            f'SELECT "partition", next_offset, commits FROM "{schema}".consumer_offsets '
            "WHERE consumer_group = $1", name)
    return since, {r["partition"]: (r["next_offset"], r["commits"]) for r in rows}


async def move_back(pool: asyncpg.Pool, schema: str, name: str, then: tuple[datetime, Rows],
                    ) -> None:
    """What a failover to a standby that missed everything after ``then`` leaves: the
    effects and dedup rows written since gone, and the offset rows as they were then."""
    since, rows = then
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(f'DELETE FROM "{schema}".ledger WHERE applied_at > $1', since)
        await conn.execute(f'DELETE FROM "{schema}".processed_events WHERE seen_at > $1', since)
        await conn.execute(f'DELETE FROM "{schema}".consumer_offsets WHERE consumer_group = $1 '
                           'AND NOT "partition" = ANY($2::int[])', name, list(rows))
        for partition, (offset, commits) in rows.items():
            await conn.execute(
                f'UPDATE "{schema}".consumer_offsets SET next_offset = $3, commits = $4 '
                'WHERE consumer_group = $1 AND "partition" = $2', name, partition, offset,
                commits)


@pytest.mark.parametrize("max_batch", [1, 100], ids=["per-record", "batched"])
async def test_each_partition_has_one_row_holding_what_the_broker_holds(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, max_batch: int,
) -> None:
    topic = await ledger_topic(partitions=2)
    events = make_events(keys=12, per_key=15)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("rows", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     limits=Limits(max_batch=max_batch),
                     offset_store="postgres")
    async with Running(consumer):
        await wait_for(lambda: _at_least(pg_pool, pg_schema, len(events)), 120, "every effect")
    verify(await rows(pg_pool, pg_schema), events)
    in_database = await stored(pg_pool, pg_schema, consumer.name)
    # offsets start at 0 without gaps: each partition's row is the count of its records
    assert sum(in_database.values()) == len(events)
    assert in_database == await committed(kafka_bootstrap, consumer.name, topic, 2)
    count = await pg_pool.fetchval(
        f'SELECT count(*) FROM "{pg_schema}".consumer_offsets WHERE consumer_group = $1',
        consumer.name)
    assert count == 2


@pytest.mark.parametrize("store", ["postgres", "kafka"])
async def test_a_crash_after_the_database_commit_redelivers_nothing_applied(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, store: str,
) -> None:
    """The worker kills itself right after its first COMMIT, before any offset reaches the
    broker. With the offsets in the database the restart starts after what that commit
    applied; with the broker's (the control) it reads those records again."""
    topic = await ledger_topic(partitions=1)
    events = make_events(keys=6, per_key=10)
    await publish(kafka_bootstrap, topic, events)
    name = group("crash", topic)
    worker = subprocess.run(
        [sys.executable, "-m", "tests.integration.worker", "--dsn", postgres_dsn,
         "--bootstrap", kafka_bootstrap, "--topic", topic, "--schema", pg_schema,
         "--name", name, "--offset-store", store, "--concurrency", "1"],
        cwd=ROOT, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT),
             "CONSUMERKIT_TORTURE": json.dumps({"arm": "after_commit"})})
    assert worker.returncode == -9, "the worker died at its fail-point"
    first = await applied(pg_pool, pg_schema)
    assert 0 < first < len(events)
    assert await committed(kafka_bootstrap, name, topic, 1) == {}
    again = build("crash", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                  offset_store=store)
    async with Running(again):
        await wait_for(lambda: _at_least(pg_pool, pg_schema, len(events)), 120, "every effect")
        await wait_for(lambda: _settled(again, len(events) - first), 60, "the rest settled")
    verify(await rows(pg_pool, pg_schema), events)
    if store == "postgres":
        assert again.stats.duplicates == 0
        assert again.stats.delivered == len(events) - first
    else:  # the control: what the first process applied comes again
        assert again.stats.duplicates >= first


async def test_a_restart_trusts_the_database_behind_the_broker(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=2)
    events = make_events(keys=8, per_key=10)
    half = len(events) // 2
    await publish(kafka_bootstrap, topic, events[:half])
    first = build("behind", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                  offset_store="postgres")
    async with Running(first):
        await wait_for(lambda: _at_least(pg_pool, pg_schema, half), 120, "the first half")
    then = await snapshot(pg_pool, pg_schema, first.name)
    await publish(kafka_bootstrap, topic, events[half:])
    second = build("behind", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                   offset_store="postgres")
    async with Running(second):
        await wait_for(lambda: _at_least(pg_pool, pg_schema, len(events)), 120, "every effect")
    assert sum((await committed(kafka_bootstrap, first.name, topic, 2)).values()) == len(events)
    await move_back(pg_pool, pg_schema, first.name, then)
    assert await applied(pg_pool, pg_schema) == half
    third = build("behind", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                  offset_store="postgres")
    async with Running(third):
        await wait_for(lambda: _at_least(pg_pool, pg_schema, len(events)), 120,
                       "the lost half applied again")
    verify(await rows(pg_pool, pg_schema), events)
    assert third.stats.delivered == len(events) - half
    assert third.stats.duplicates == 0


async def test_a_database_that_moved_back_under_a_running_consumer_is_read_again(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture,
) -> None:
    topic = await ledger_topic(partitions=2)
    events = make_events(keys=10, per_key=8)
    half = len(events) // 2
    await publish(kafka_bootstrap, topic, events[:half])
    registry = CollectorRegistry()
    consumer = build("moved", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     offset_store="postgres", registry=registry)
    with caplog.at_level(logging.WARNING, "consumerkit"):
        async with Running(consumer):
            await wait_for(lambda: _at_least(pg_pool, pg_schema, half), 120, "the first half")
            await wait_for(lambda: _stored_all(pg_pool, pg_schema, consumer.name, half), 60,
                           "the first half's offsets stored")
            then = await snapshot(pg_pool, pg_schema, consumer.name)
            await publish(kafka_bootstrap, topic, events[half:])
            await wait_for(lambda: _at_least(pg_pool, pg_schema, len(events)), 120,
                           "every effect")
            await wait_for(lambda: _stored_all(pg_pool, pg_schema, consumer.name,
                                               len(events)), 60, "every offset stored")
            # the failover: the database goes back to ``since``, and every connection drops
            await move_back(pg_pool, pg_schema, consumer.name, then)
            assert await applied(pg_pool, pg_schema) == half
            await pg_pool.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = $1", f"consumerkit:{consumer.name}")
            await wait_for(lambda: _at_least(pg_pool, pg_schema, len(events)), 120,
                           "the lost half applied again")
    verify(await rows(pg_pool, pg_schema), events)
    assert await stored(pg_pool, pg_schema, consumer.name) == await committed(
        kafka_bootstrap, consumer.name, topic, 2)
    moved = [p for p, (off, _) in then[1].items()
             if off < (await stored(pg_pool, pg_schema, consumer.name))[p]]
    assert consumer.stats.offsets_moved_back == len(moved) > 0
    lines = [r for r in caplog.records if "the database moved back" in r.getMessage()]
    assert len(lines) == len(moved)
    assert registry.get_sample_value(
        "consumerkit_offsets_moved_back_total",
        {"consumer": consumer.name, "topic": topic}) == len(moved)


async def test_commits_lost_without_moving_the_offset_are_found_by_their_count(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    """Records above one still in flight commit without moving the row's offset. A database
    that loses only those commits holds the same offset as before, and fewer commits: the
    consumer reads them again all the same."""
    topic = await ledger_topic(partitions=1)
    first, blocker = Event("z-1", "key-z", 1), Event("a-1", "key-a", 1)
    later = [Event(f"b-{n}", f"key-b{n}", 1) for n in range(8)]
    entered, release = asyncio.Event(), asyncio.Event()

    async def hold(event: Step, ctx: HandlerContext) -> None:
        if event.key == "key-a" and not release.is_set():
            entered.set()
            async with asyncio.timeout(60):
                await release.wait()

    consumer = build("alone", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=hold,
                     offset_store="postgres")
    async with Running(consumer):
        await publish(kafka_bootstrap, topic, [first])
        await wait_for(lambda: _stored_all(pg_pool, pg_schema, consumer.name, 1), 60,
                       "the first record stored")
        await publish(kafka_bootstrap, topic, [blocker])
        await wait_for(_true(entered), 60, "the blocker's handler running")
        then = await snapshot(pg_pool, pg_schema, consumer.name)
        assert then[1] == {0: (1, 1)}
        await publish(kafka_bootstrap, topic, later)
        await wait_for(lambda: _at_least(pg_pool, pg_schema, 1 + len(later)), 60,
                       "the records after the blocker applied")
        row = await pg_pool.fetchrow(
            f'SELECT next_offset, commits FROM "{pg_schema}".consumer_offsets')
        assert row is not None
        assert row["next_offset"] == 1  # held back by the blocker still in flight
        assert row["commits"] > 1
        await move_back(pg_pool, pg_schema, consumer.name, then)
        await pg_pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = $1", f"consumerkit:{consumer.name}")
        release.set()
        await wait_for(lambda: _at_least(pg_pool, pg_schema, 2 + len(later)), 120,
                       "every record applied")
        await wait_for(lambda: _stored_all(pg_pool, pg_schema, consumer.name, 2 + len(later)),
                       60, "every offset stored")
    verify(await rows(pg_pool, pg_schema), [first, blocker, *later])
    assert consumer.stats.offsets_moved_back == 1


async def test_dead_letters_and_undecodable_records_move_the_stored_offset_too(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    """Records settled without a transaction of their own are stored by the committer: a
    restart does not read them again."""
    topic = await ledger_topic(partitions=1)
    events = make_events(keys=2, per_key=3)

    async def refuse(event: Step, ctx: HandlerContext) -> None:
        if event.seq == 3:
            raise ValueError("refused")  # not retriable: to the dead letters at once

    await publish(kafka_bootstrap, topic, events)
    await publish_raw(kafka_bootstrap, topic, [(b"key-9", b"not json", [
        ("id", b"raw-1"), ("event_type", b"step.recorded")])])
    consumer = build("letters", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     fail=refuse, offset_store="postgres")
    async with Running(consumer):
        await wait_for(lambda: _settled(consumer, len(events) + 1), 120, "every record")
    assert consumer.stats.dead_lettered == 3
    assert await stored(pg_pool, pg_schema, consumer.name) == {0: len(events) + 1}
    again = build("letters", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                  offset_store="postgres")
    later = make_events(keys=1, per_key=1, prefix="later")
    async with Running(again):
        await wait_for(lambda: _assigned(again), 60, "the partition")
        await publish(kafka_bootstrap, topic, later)
        await wait_for(lambda: _settled(again, 1), 60, "the record after")
    assert again.stats.delivered == 1  # only the record after: it started past the others


def test_an_unknown_offset_store_is_refused() -> None:
    from consumerkit.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="offset_store must be one of kafka, postgres"):
        Consumer(name="x", topics=["t"], handlers=[ledger_handler("s")],
                 offset_store="redis")  # type: ignore[arg-type]


def _true(event: asyncio.Event) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return event.is_set()
    return check


async def _assigned(consumer: Consumer) -> bool:
    return bool(consumer.assignment)


async def _at_least(pool: asyncpg.Pool, schema: str, value: int) -> bool:
    return await applied(pool, schema) >= value


async def _stored_all(pool: asyncpg.Pool, schema: str, name: str, value: int) -> bool:
    return sum((await stored(pool, schema, name)).values()) >= value


async def _settled(consumer: Consumer, value: int) -> bool:
    await asyncio.sleep(0)
    s = consumer.stats
    return s.applied + s.duplicates + s.dead_lettered >= value


pytestmark = pytest.mark.slow
