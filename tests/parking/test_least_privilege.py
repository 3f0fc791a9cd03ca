"""Parking under a runtime role granted only what ``consumerkit migrate --print-grants``
prints (plus the application's own table): the consumer parks, replay applies and unparks,
discard drops, and ``permission denied`` is nowhere."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from consumerkit import Postgres, RetryPolicy
from consumerkit.engine.replay import discard_key, replay_key
from consumerkit.testing import TestConsumer

from .moves import BROKEN, Move, move

ROOT = Path(__file__).resolve().parents[2]


async def owner_cli(*args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumerkit", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.fixture
async def role(pg_pool: asyncpg.Pool) -> AsyncIterator[str]:
    name = f"ck_parker_{uuid.uuid4().hex[:8]}"
    await pg_pool.execute(f'CREATE ROLE "{name}" LOGIN')
    try:
        yield name
    finally:
        await pg_pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name)
        await pg_pool.execute(f'DROP OWNED BY "{name}"')
        await pg_pool.execute(f'DROP ROLE "{name}"')


async def test_a_runtime_role_parks_replays_and_discards_with_the_printed_grants(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool, role: str,
) -> None:
    grants = (await owner_cli("migrate", "--postgres", postgres_dsn, "--schema", pg_schema,
                              "--print-grants", role)).splitlines()
    s = f'"{pg_schema}"'
    async with pg_pool.acquire() as conn:
        for statement in grants:
            await conn.execute(statement)
        await conn.execute(f"CREATE TABLE {s}.moves (id bigserial, key text, seq int)")
        await conn.execute(f'GRANT SELECT, INSERT ON {s}.moves TO "{role}"')
        await conn.execute(f'GRANT USAGE ON SEQUENCE {s}.moves_id_seq TO "{role}"')
        await conn.execute(f'ALTER ROLE "{role}" SET search_path = {s}')
    parts = urlsplit(postgres_dsn)
    dsn = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
    BROKEN.update({2, 5})
    try:
        async with TestConsumer([move],
                                postgres=Postgres(dsn=dsn, schema=pg_schema),
                                migrate=False,
                                retry=RetryPolicy(max_attempts=1), partitions=1) as kit:
            for seq in (1, 2, 3):
                kit.publish(Move(seq=seq), key="a")
            for seq in (5, 6):
                kit.publish(Move(seq=seq), key="b")
            await kit.drain(fail_fast=False)
            assert kit.stats.parked == 4
            BROKEN.clear()
            report = await replay_key(kit.consumer, b"a")
            assert report.applied == 2
            runtime = await asyncpg.connect(dsn)
            try:
                _, dropped = await discard_key(runtime, pg_schema, kit.consumer.name, b"b")
            finally:
                await runtime.close()
            assert dropped == 2
    finally:
        BROKEN.clear()
    rows = await pg_pool.fetch(f"SELECT key, seq FROM {s}.moves ORDER BY id")
    assert [(r["key"], r["seq"]) for r in rows] == [("a", 1), ("a", 2), ("a", 3)]
    audit = await pg_pool.fetch(f"SELECT action, records, db_role FROM {s}.parked_audit "
                                "ORDER BY id")
    assert [(a["action"], a["records"], a["db_role"]) for a in audit] == [
        ("replayed", 2, role), ("discarded", 2, role)]
