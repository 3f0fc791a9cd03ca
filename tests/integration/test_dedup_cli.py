"""``consumerkit dedup partitions|maintain|check`` and ``migrate --layout`` against a real
PostgreSQL and broker."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit.cli import main
from consumerkit.testing.services import MakeTopic

from ..conftest import wait_for_partitions


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    # the CLI runs its own event loop: call it from a worker thread
    return await asyncio.to_thread(run, capsys, *argv)


async def test_the_table_layout_from_the_command_line(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    assert (await cli(capsys, "dedup", "maintain", *db))[0] == 1  # nothing there yet
    assert (await cli(capsys, "migrate", *db, "--layout", "table"))[0] == 0
    code, out = await cli(capsys, "migrate", *db)  # the partitioned default is refused
    assert code == 1
    assert "exists with the 'table' layout" in out

    now: datetime = await pg_pool.fetchval("SELECT now()")
    key = f'"{pg_schema}".consumerkit_name_key'
    await pg_pool.execute(  # one row per day, each with two ids (as a claim of two stores)
        f'INSERT INTO "{pg_schema}".processed_events (seen_at, namespace_key, handler_key,'
        f" texts) SELECT $1::timestamptz - g * interval '1 day', {key}('billing'),"
        f" {key}('charge'), ARRAY['e-' || g, 'f-' || g] FROM generate_series(0, 11) AS g", now)
    code, out = await cli(capsys, "dedup", "partitions", *db, "--exact")
    assert code == 0
    assert "processed_events" in out
    assert "one table (table layout), 12 rows, 24 ids" in out
    code, out = await cli(capsys, "dedup", "maintain", *db)
    assert code == 0
    # 8 days and older: past 7 days + 1 hour of skew
    assert "deleted 8 expired event ids" in out
    assert await pg_pool.fetchval(
        f'SELECT count(*) FROM "{pg_schema}".processed_events_ids') == 16


async def test_partitions_with_exact_counts_and_totals(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    assert (await cli(capsys, "migrate", *db))[0] == 0
    key = f'"{pg_schema}".consumerkit_name_key'
    await pg_pool.execute(
        f'INSERT INTO "{pg_schema}".processed_events (namespace_key, handler_key, uuids, texts)'
        f" SELECT {key}('billing'), {key}('charge'), ARRAY[gen_random_uuid()], ARRAY['e-' || g]"
        " FROM generate_series(1, 3) AS g")
    code, out = await cli(capsys, "dedup", "partitions", *db, "--exact")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["partition", "from", "to", "rows", "ids", "bytes"]
    assert sum(line.startswith("processed_events_p") for line in lines) >= 4
    assert "partitions, 3 rows, 6 ids" in lines[-1]
    code, out = await cli(capsys, "dedup", "partitions", *db)
    assert "~rows" in out.splitlines()[0]


async def test_check_reports_a_topic_that_outlives_the_window(
    kafka_bootstrap: str, make_topic: MakeTopic, capsys: pytest.CaptureFixture[str],
) -> None:
    short = await make_topic(partitions=1)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=10_000)
    await admin.start()
    kept = f"{short}-kept"
    try:
        await admin.create_topics([NewTopic(kept, 1, 1, topic_configs={
            "retention.ms": str(int(timedelta(days=30).total_seconds() * 1000))})])
        await wait_for_partitions(admin, kept, 1)  # every broker knows it before the check
        code, out = await cli(capsys, "dedup", "check", "--kafka", kafka_bootstrap,
                              "--topic", kept, "--retention", "7d")
        assert code == 0
        assert f"warning: topic {kept} keeps records for 30d" in out
        code, out = await cli(capsys, "dedup", "check", "--kafka", kafka_bootstrap,
                              "--topic", kept, "--retention", "31d")
        assert code == 0
        assert "covers every redelivery horizon found" in out
    finally:
        await admin.delete_topics([kept])
        await admin.close()
    code, out = await cli(capsys, "dedup", "check", "--topic", kept)
    assert code == 1
    assert "needs --kafka" in out
