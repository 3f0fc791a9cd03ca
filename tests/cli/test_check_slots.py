"""A replication slot whose reader is down keeps WAL until the disk fills: ``consumerkit check``
reports it, and a consumer with an outbox on that database exports it as metrics. Tested with a
real inactive logical slot on a PostgreSQL with ``wal_level=logical``."""

from __future__ import annotations

import argparse
import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Kafka, Postgres, handler
from consumerkit.cli.check_slots import wal_size
from consumerkit.outbox import Outbox
from consumerkit.testing.services import MakeTopic
from tests.harness import LogicalPostgres, start_logical_postgres

from .test_migrate_check import run

MIB = 1 << 20


@pytest.fixture(scope="module")
def logical_postgres() -> Iterator[LogicalPostgres]:
    with start_logical_postgres() as server:
        yield server


@pytest_asyncio.fixture(loop_scope="session")
async def stale_slot(logical_postgres: LogicalPostgres) -> AsyncIterator[str]:
    """An inactive logical slot that keeps at least 4 MiB of WAL written after it."""
    name = f"ck_stale_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(logical_postgres.dsn)
    try:
        await conn.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", name)
        await conn.execute("CREATE TABLE IF NOT EXISTS filler (b text)")
        await conn.execute("INSERT INTO filler SELECT repeat(md5(g::text), 32) "
                           "FROM generate_series(1, 5000) AS g")  # ~5 MiB of WAL
        yield name
    finally:
        await conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                           "pg_replication_slots WHERE slot_name = $1", name)
        await conn.close()


def test_sizes_read_as_bytes() -> None:
    assert wal_size("1GiB") == 1 << 30
    assert wal_size("512MiB") == 512 * MIB
    assert wal_size("2GB") == 2_000_000_000
    assert wal_size("100") == 100
    with pytest.raises(argparse.ArgumentTypeError, match="invalid size"):
        wal_size("lots")


async def test_check_reports_an_inactive_slot_keeping_wal(
    logical_postgres: LogicalPostgres, stale_slot: str, capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--postgres", logical_postgres.dsn]
    code, out = await run(capsys, "check", *db, "--max-slot-wal", "1MiB")
    line = next(li for li in out.splitlines() if stale_slot in li)
    assert code == 1
    assert line.startswith("PROBLEM  replication slot")
    assert "has no reader (inactive)" in line
    assert "of WAL (limit 1.0 MiB)" in line
    assert f"pg_drop_replication_slot('{stale_slot}')" in line

    # under a limit it does not reach, the slot is still reported: nothing reads it
    code, out = await run(capsys, "check", *db, "--max-slot-wal", "1GiB")
    line = next(li for li in out.splitlines() if stale_slot in li)
    assert "inactive" in line
    assert "of WAL" not in line


async def test_check_says_nothing_of_slots_when_there_are_none(
    logical_postgres: LogicalPostgres, capsys: pytest.CaptureFixture[str],
) -> None:
    _, out = await run(capsys, "check", "--postgres", logical_postgres.dsn)  # tables: none
    assert "replication slot" not in out, out


class Ping(BaseModel):
    n: int


@handler("ping")
async def on_ping(event: Ping, ctx: HandlerContext) -> None:
    del event, ctx


async def test_a_consumer_with_an_outbox_exports_the_slot(
    logical_postgres: LogicalPostgres, stale_slot: str, kafka_bootstrap: str,
    make_topic: MakeTopic,
) -> None:
    registry = CollectorRegistry()
    schema = f"slots_{uuid.uuid4().hex[:8]}"
    consumer = Consumer(name=f"slots-{schema}", handlers=[on_ping],
                        topics=[await make_topic(1)],
                        postgres=Postgres(dsn=logical_postgres.dsn, schema=schema),
                        kafka=Kafka(bootstrap=kafka_bootstrap),
                        outbox=Outbox(schema, "outbox"), handle_signals=False,
                        registry=registry)
    running = asyncio.create_task(consumer.run())
    labels = {"slot": stale_slot}
    try:
        async with asyncio.timeout(60):
            while registry.get_sample_value("consumerkit_replication_slot_active",
                                            labels) is None:
                await asyncio.sleep(0.1)
    finally:
        await consumer.stop()
        async with asyncio.timeout(60):
            await running
    assert registry.get_sample_value("consumerkit_replication_slot_active", labels) == 0
    wal = registry.get_sample_value("consumerkit_replication_slot_wal_bytes", labels)
    assert wal is not None
    assert wal > 4 * MIB
