"""Twelve consumer processes with a Consumer's default batching drain a backlog of one topic
(12 partitions, 3,000 keys, 24,000 events) on PostgreSQL with default settings: every event
applied once, no ``out of shared memory`` anywhere, and the lock table's peak (entries of every
kind in ``pg_locks``, sampled while they run) far below the server's 6,400.

With the per-id advisory locks of the claim before the guard, each of the 48 transactions in
flight held an entry per id (up to 500): the peak went past the table's size, and the
consumers' handlers failed with ``out of shared memory``."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from consumerkit.schema import migrate
from consumerkit.testing.services import MakeTopic, start_postgres
from tests.brokers import IDEMPOTENCE
from tests.torture import ledger
from tests.torture.procs import Proc, Procs

pytestmark = pytest.mark.slow

PROCESSES = 12
PARTITIONS = 12
KEYS = 3000
PER_KEY = 8
ENTRIES_PER_TRANSACTION = 64
"""A bound on a consumer transaction's lock-table entries: its claim's (the dedup partitions
and their indexes, the guard, the names table: 20 to 30 measured) and the handler's tables."""
PEAK_BOUND = PROCESSES * 4 * ENTRIES_PER_TRANSACTION  # 4: a Consumer's concurrency with batches
DEFAULTS = {"max_connections": "100", "max_locks_per_transaction": "64"}
JOIN_TIMEOUT = 120.0
DRAIN_TIMEOUT = 180.0
ASSIGNED = re.compile(r"assigned \[(.*)\]")


@contextlib.asynccontextmanager
async def default_server(dsn: str) -> AsyncIterator[str]:
    """``dsn`` if its server has PostgreSQL's default lock-table size, else a server of
    this test's own (stopped after it)."""
    conn = await asyncpg.connect(dsn)
    try:
        settings = {n: await conn.fetchval(f"SHOW {n}") for n in DEFAULTS}
    finally:
        await conn.close()
    if settings == DEFAULTS:
        yield dsn
        return
    server = await asyncio.to_thread(start_postgres)
    try:
        yield server.dsn
    finally:
        await asyncio.to_thread(server.stop)


def _assignment(proc: Proc) -> str:
    """The partitions ``proc`` logged last as assigned ("" before any)."""
    found = ASSIGNED.findall(proc.log.read_text(errors="replace")) if proc.log.exists() else []
    return found[-1] if found else ""


async def _until(condition: object, timeout: float, what: str) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g}s waiting for {what}"
        await asyncio.sleep(0.2)


async def _publish(bootstrap: str, topic: str) -> int:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                                enable_idempotence=IDEMPOTENCE)
    await producer.start()
    try:
        sent = [await producer.send(
            topic, key=f"agg-{k}".encode(),
            headers=[("id", f"e-{k}-{s}".encode()), ("event_type", ledger.EVENT_TYPE.encode())],
            value=ledger.Step(aggregate=f"agg-{k}", seq=s).model_dump_json().encode())
            for s in range(1, PER_KEY + 1) for k in range(KEYS)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return len(sent)


async def test_twelve_consumer_processes_stay_far_from_the_lock_table(
    embedded_postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    tmp_path: Path,
) -> None:
    topic = await make_topic(partitions=PARTITIONS)
    async with default_server(embedded_postgres_dsn) as dsn:
        conn = await asyncpg.connect(dsn)
        procs = Procs(tmp_path, "")
        try:
            await migrate(conn, pg_schema)
            await ledger.create(conn, pg_schema, KEYS)
            for i in range(PROCESSES):  # a Consumer's defaults: 5,000 in flight, batches of 500
                procs.add(f"consumer-{i}", "tests.torture.consumer_proc", "--dsn", dsn,
                          "--bootstrap", kafka_bootstrap, "--topic", topic, "--schema",
                          pg_schema, "--max-in-flight", "5000").start()
            consumers = procs.role("consumer")

            async def joined() -> bool:  # each of the twelve holds a partition
                assert all(p.running() for p in consumers), "a consumer process died"
                return all(_assignment(p) for p in consumers)

            await _until(joined, JOIN_TIMEOUT, "twelve consumers in the group")
            peak = {"entries": 0, "backends": 0}
            sampling = asyncio.Event()

            async def sample() -> None:
                observer = await asyncpg.connect(dsn)
                try:
                    while not sampling.is_set():
                        row = await observer.fetchrow(
                            "SELECT count(*) AS n, count(DISTINCT pid) AS b FROM pg_locks")
                        assert row is not None
                        peak["entries"] = max(peak["entries"], row["n"])
                        peak["backends"] = max(peak["backends"], row["b"])
                        await asyncio.sleep(0.01)
                finally:
                    await observer.close()

            sampler = asyncio.create_task(sample())
            started = time.monotonic()
            events = await _publish(kafka_bootstrap, topic)
            effects = f'SELECT count(*) FROM "{pg_schema}".effects'

            async def drained() -> bool:
                assert not sampler.done() or sampler.exception() is None
                return int(await conn.fetchval(effects)) >= events

            await _until(drained, DRAIN_TIMEOUT, f"{events} effects")
            took = time.monotonic() - started
            sampling.set()
            await sampler
        finally:
            procs.stop_all()
            await conn.close()
        conn = await asyncpg.connect(dsn)
        try:
            row = await conn.fetchrow(
                f'SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM "{pg_schema}".effects')
            violations = await conn.fetchval(f'SELECT count(*) FROM "{pg_schema}".violations')
        finally:
            await conn.close()
    logs = {p.name: p.log.read_text(errors="replace") for p in consumers}
    print(f"{PROCESSES} consumer processes drained {events} events in {took:.1f}s; lock-table "
          f"entries at peak {peak['entries']} held by {peak['backends']} backends "
          f"(bound {PEAK_BOUND})")
    assert row is not None
    assert (row["n"], row["d"]) == (events, events)
    assert violations == 0
    assert not [name for name, text in logs.items() if "out of shared memory" in text]
    assert 0 < peak["entries"] <= PEAK_BOUND
