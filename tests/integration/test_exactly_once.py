"""End to end on a real broker and a real PostgreSQL: duplicates, order, crashes, rebalances."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumerkit import Consumer, Limits

from .conftest import LedgerTopic
from .ledger import (
    Event,
    Running,
    build,
    group,
    ledger_rows,
    make_events,
    publish,
    settled,
    verify,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
DAY_MS = 86_400_000



async def count(pool: asyncpg.Pool, schema: str) -> int:
    value = await pool.fetchval(f'SELECT count(*) FROM "{schema}".ledger')
    assert isinstance(value, int)
    return value


async def rows(pool: asyncpg.Pool, schema: str) -> list[asyncpg.Record]:
    async with pool.acquire() as conn:
        return await ledger_rows(conn, schema)


@pytest.mark.parametrize("max_batch", [1, 100], ids=["per-record", "batched"])
async def test_2000_events_with_duplicates_apply_once_in_key_order(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, max_batch: int,
) -> None:
    topic = await ledger_topic(partitions=4)
    events = make_events(keys=50, per_key=40)
    rng = random.Random(2000)
    now_ms = int(time.time() * 1000)
    # 10 % re-sent; half of those carry a record timestamp three days after the original's
    resent = [Event(e.event_id, e.key, e.seq, timestamp_ms=now_ms + 3 * DAY_MS if i % 2 else None)
              for i, e in enumerate(rng.sample(events, 200))]
    await publish(kafka_bootstrap, topic, events)
    await publish(kafka_bootstrap, topic, resent)
    consumer = build("billing", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     limits=Limits(max_batch=max_batch))
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, 2200), 120, "2,200 deliveries settled")
    verify(await rows(pg_pool, pg_schema), events)
    assert consumer.stats.applied == 2000
    assert consumer.stats.duplicates == 200
    assert consumer.stats.dead_lettered == 0
    if max_batch == 1:
        assert consumer.stats.batches == 0
    else:  # most records shared a transaction with others
        assert 0 < consumer.stats.batches < 1000


async def test_sigkill_mid_stream_loses_nothing_and_applies_nothing_twice(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=3)
    events = make_events(keys=20, per_key=60)
    await publish(kafka_bootstrap, topic, events)
    args = [sys.executable, "-m", "tests.integration.worker", "--dsn", postgres_dsn,
            "--bootstrap", kafka_bootstrap, "--topic", topic, "--schema", pg_schema,
            "--name", group("crashy", topic)]
    first = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        await wait_for(lambda: _at_least(pg_pool, pg_schema, 300), 120, "300 effects")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        killed_at = await count(pg_pool, pg_schema)
        assert killed_at < len(events), "the kill must land mid-stream"
        second = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            await wait_for(lambda: _at_least(pg_pool, pg_schema, len(events)), 180,
                           "every effect after the restart")
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0, "graceful shutdown on SIGTERM exits cleanly"
        finally:
            _kill(second)
    finally:
        _kill(first)
    verify(await rows(pg_pool, pg_schema), events)
    dedup_rows = await pg_pool.fetchval(
        f'SELECT count(*) FROM "{pg_schema}".processed_events_ids WHERE namespace = $1',
        group("crashy", topic))
    assert dedup_rows == len(events)


async def test_rebalance_mid_stream_loses_nothing_and_applies_nothing_twice(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=4)
    events = make_events(keys=30, per_key=50)
    # two thirds before the second member joins, the rest once it holds partitions: the
    # first member may be done with its share by then, so the rest gives the second work
    split = len(events) * 2 // 3
    await publish(kafka_bootstrap, topic, events[:split])
    first = build("inventory", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                  limits=Limits(concurrency=2, max_in_flight=50))
    second = build("inventory", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                   limits=Limits(concurrency=2, max_in_flight=50))
    async with Running(first):
        await wait_for(lambda: _at_least(pg_pool, pg_schema, 150), 120, "150 effects")
        async with Running(second):
            await wait_for(lambda: _assigned(second), 60, "the second member's partitions")
            await publish(kafka_bootstrap, topic, events[split:])
            await wait_for(lambda: _at_least(pg_pool, pg_schema, len(events)), 180,
                           "every effect")
    verify(await rows(pg_pool, pg_schema), events)
    assert second.stats.applied > 0, "the rebalance handed work to the second member"
    assert first.stats.applied + second.stats.applied == len(events)


async def test_graceful_stop_commits_every_finished_offset(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=2)
    events = make_events(keys=10, per_key=20)
    await publish(kafka_bootstrap, topic, events)
    first = build("stopper", pg_schema, topic, postgres_dsn, kafka_bootstrap)
    async with Running(first):
        await wait_for(lambda: _at_least(pg_pool, pg_schema, len(events)), 60, "every effect")
    # offsets start at 0 and have no gaps here, so the committed offsets sum to the count
    assert await committed_total(kafka_bootstrap, group("stopper", topic), topic, 2) == len(events)
    verify(await rows(pg_pool, pg_schema), events)


async def committed_total(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    probe = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False)
    await probe.start()
    try:
        offsets = [await probe.committed(TopicPartition(topic, p)) for p in range(partitions)]
    finally:
        await probe.stop()
    return sum(o or 0 for o in offsets)


async def _at_least(pool: asyncpg.Pool, schema: str, value: int) -> bool:
    return await count(pool, schema) >= value


async def _assigned(consumer: Consumer) -> bool:
    return bool(consumer.assignment)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


pytestmark = pytest.mark.slow
