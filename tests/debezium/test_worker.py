"""``start_debezium``: a Kafka Connect worker with Debezium's outbox connector, on a PostgreSQL
with ``wal_level=logical``, publishes each outbox insert to Kafka; killed with SIGKILL and
started again it resumes from its offsets file, losing nothing; stopped, it drops its slot."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from examples.debezium_local import with_a_connector
from tests.harness import LogicalPostgres, start_debezium
from tests.harness.kafka_jars import MissingToolError

from ..outbox.conftest import Published, read_all
from .conftest import Cdc, MakeCdc


async def write(cdc: Cdc, keys: list[str], start: int, count: int) -> list[str]:
    """``count`` events per key, numbered from ``start``, one transaction per event."""
    ids = []
    conn = await asyncpg.connect(cdc.postgres.dsn)
    try:
        for n in range(start, start + count):
            for key in keys:
                async with conn.transaction():
                    added = await cdc.outbox.add(
                        conn, event_type="step.done", aggregate_type=cdc.topic,
                        aggregate_id=key, payload={"key": key, "n": n})
                ids.append(str(added))
    finally:
        await conn.close()
    return ids


def ids_of(records: list[Published]) -> list[str]:
    return [r.headers["id"].decode() for r in records]


async def test_the_worker_streams_inserts_and_resumes_after_sigkill(make_cdc: MakeCdc) -> None:
    cdc = await make_cdc(3)
    worker = await asyncio.to_thread(cdc.start)
    status = worker.status()
    assert status is not None
    assert status["connector"]["state"] == "RUNNING"

    first = await write(cdc, ["a", "b"], 0, 5)
    seen = await read_all(cdc.kafka.bootstrap, [cdc.topic],
                          lambda found: set(first) <= set(ids_of(found)))
    assert set(ids_of(seen)) == set(first)

    await asyncio.to_thread(worker.kill)
    assert not worker.running()
    second = await write(cdc, ["a", "b"], 5, 5)  # written while no reader runs: the slot keeps it
    await asyncio.to_thread(worker.start)
    everything = await read_all(cdc.kafka.bootstrap, [cdc.topic],
                                lambda found: set(first + second) <= set(ids_of(found)))
    assert set(ids_of(everything)) == set(first + second)  # nothing lost, nothing invented

    await asyncio.to_thread(worker.stop)
    conn = await asyncpg.connect(cdc.postgres.dsn)
    try:
        left = await conn.fetchval("SELECT count(*) FROM pg_replication_slots "
                                   "WHERE slot_name = $1", worker.slot)
    finally:
        await conn.close()
    assert left == 0, "a stopped worker leaves no slot behind to retain WAL"


def test_without_java_start_debezium_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    unreachable = LogicalPostgres.__new__(LogicalPostgres)  # never started: Java is checked first
    with pytest.raises(MissingToolError, match="Java 17"):
        start_debezium("127.0.0.1:9", unreachable)


def test_names_are_validated_before_anything_starts() -> None:
    unreachable = LogicalPostgres.__new__(LogicalPostgres)
    with pytest.raises(ValueError, match="slot name"):
        start_debezium("127.0.0.1:9", unreachable, slot=f"Bad-{uuid.uuid4().hex}")


async def test_the_documented_example_runs(make_cdc: MakeCdc) -> None:
    cdc = await make_cdc(1)
    await asyncio.to_thread(with_a_connector, cdc.kafka, cdc.postgres, cdc.table)
    conn = await asyncpg.connect(cdc.postgres.dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM pg_replication_slots "
                                   "WHERE slot_name = $1", cdc.table.replication_slot) == 0
    finally:
        await conn.close()
