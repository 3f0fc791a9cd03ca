"""The command line against a real PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import pytest

from consumerkit import DeadLetterEntry, DeadLetterTable
from consumerkit.cli import main
from consumerkit.types import SinkResources


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


async def test_migrate_partitions_maintain_and_dead_letters(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    # the CLI runs its own event loop: call it from a worker thread
    code, out = await asyncio.to_thread(run, capsys, "migrate", *db)
    assert code == 0
    assert f"schema {pg_schema} is up to date" in out
    code, out = await asyncio.to_thread(run, capsys, "dedup", "partitions", *db)
    assert code == 0
    assert out.count("processed_events_p") >= 4  # the current one and those made ahead
    code, out = await asyncio.to_thread(run, capsys, "dedup", "maintain", *db)
    assert code == 0
    assert "created none" in out
    sink = DeadLetterTable()
    await sink.open(SinkResources(pg_pool, pg_schema, "unused:9092", {}))
    await sink.send(DeadLetterEntry(
        consumer="billing", topic="orders", partition=1, offset=42, key=b"k", value=b"{",
        headers=[], reason="invalid_json", detail="unexpected end", event_id="e-1",
        failed_at=datetime.now(UTC)))
    code, out = await asyncio.to_thread(run, capsys, "dead-letters", *db, "--consumer", "billing")
    assert code == 0
    assert "orders/1/42 id=e-1" in out
    assert "invalid_json: unexpected end" in out
    assert "1 dead letters" in out


def test_unreachable_database_is_a_clear_error_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(capsys, "migrate", "--postgres", "postgresql://app:hunter2@127.0.0.1:1/x")
    assert code == 1
    assert "cannot connect to PostgreSQL at postgresql://app:***@127.0.0.1:1/x" in out
    assert "connection refused" in out
    assert "hunter2" not in out


def test_invalid_schema_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "migrate", "--postgres", "postgresql://x@127.0.0.1:1/x",
                    "--schema", "bad;name")
    assert code == 1
    assert "invalid schema name" in out
