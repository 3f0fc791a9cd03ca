"""``consumerkit parked list | replay | discard`` as a person runs them: output, the audit row,
and one line for each mistake."""

from __future__ import annotations

import shutil
from pathlib import Path

import asyncpg
import pytest

from consumerkit import migrate
from consumerkit.parking import ParkedRecord, store

from ..cli.conftest import cli
from ..integration.ledger import Step, create_ledger

HERE = Path(__file__).parent
APP = "parked-app"


def parked(offset: int, seq: int, key: str = "order-7", partition: int = 0) -> ParkedRecord:
    value = Step(key=key, seq=seq).model_dump_json().encode()
    return ParkedRecord(
        consumer=APP, topic="steps", partition=partition, offset=offset, key=key.encode(),
        value=value, headers=[("id", f"{key}-{seq}".encode()), ("event_type", b"step.recorded")],
        timestamp_ms=None, reason="handler_failed" if seq == 1 else "key_parked", detail="boom",
        attempts=3 if seq == 1 else 0, event_id=f"{key}-{seq}", event_type="step.recorded")


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    shutil.copy(HERE / "app_parked.py", tmp_path / "app_parked.py")
    return tmp_path


async def park_two_keys(pool: asyncpg.Pool, schema: str) -> None:
    async with pool.acquire() as conn:
        await migrate(conn, schema)
        await create_ledger(conn, schema)
        await store.park(conn, schema, [parked(10, 1)], start=True)
        await store.park(conn, schema, [parked(12, 2), parked(15, 3)], start=False)
        await store.park(conn, schema, [parked(4, 1, key="order-9", partition=1)], start=True)


async def test_list_replay_and_discard(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool, app_dir: Path,
) -> None:
    await park_two_keys(pg_pool, pg_schema)
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    listed = await cli("parked", "list", *db, cwd=app_dir)
    assert listed.code == 0, listed.err
    lines = listed.out.splitlines()
    assert f"{APP} steps/0 key='order-7' records=3 from offset 10: handler_failed: boom" in (
        lines[0])
    assert lines[-1] == "2 parked keys, 4 records"
    env = {"PARKED_TEST_SCHEMA": pg_schema}
    replayed = await cli("parked", "replay", "order-7", "--app", "app_parked:consumer",
                         "--postgres", postgres_dsn, cwd=app_dir, env=env)
    assert replayed.code == 0, replayed.err
    assert replayed.out.strip() == (
        "replayed key 'order-7' of steps/0: 3 records (3 applied, 0 duplicates, "
        "0 dead-lettered, 0 skipped); the key is unparked")
    ledger = await pg_pool.fetch(f'SELECT event_id FROM "{pg_schema}".ledger ORDER BY id')
    assert [r["event_id"] for r in ledger] == ["order-7-1", "order-7-2", "order-7-3"]
    again = await cli("parked", "replay", "order-7", "--app", "app_parked:consumer",
                      "--postgres", postgres_dsn, cwd=app_dir, env=env)
    assert again.code == 0, again.err
    assert again.out.startswith("key 'order-7' is not parked (last replayed by ")
    assert again.out.strip().endswith("nothing to replay")
    dropped = await cli("parked", "discard", "order-9", "--consumer", APP, *db, cwd=app_dir)
    assert dropped.code == 0, dropped.err
    assert dropped.out.strip() == (
        "discarded key 'order-9' of steps/1: 1 records dropped (recorded in parked_audit)")
    audit = await pg_pool.fetch(
        f'SELECT action, records FROM "{pg_schema}".parked_audit ORDER BY id')
    assert [(a["action"], a["records"]) for a in audit] == [("replayed", 3), ("discarded", 1)]
    empty = await cli("parked", "list", *db, cwd=app_dir)
    assert empty.out.strip() == "0 parked keys, 0 records"


async def test_mistakes_are_one_line(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool, app_dir: Path,
) -> None:
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    missing = await cli("parked", "list", *db, cwd=app_dir)
    assert missing.code == 1
    assert _one_line(missing.err).endswith(
        "does not exist: run `consumerkit migrate` (with the same --postgres and --schema) "
        "to create it")
    await park_two_keys(pg_pool, pg_schema)
    unknown_key = await cli("parked", "discard", "nope", "--consumer", APP, *db, cwd=app_dir)
    assert unknown_key.code == 1
    assert _one_line(unknown_key.err) == (
        f"consumerkit: no parked key 'nope' for consumer {APP} (consumerkit parked list "
        "shows them)")
    unknown_consumer = await cli("parked", "discard", "order-7", "--consumer", "biling", *db,
                                 cwd=app_dir)
    assert unknown_consumer.code == 1
    assert _one_line(unknown_consumer.err) == (
        "consumerkit: consumer 'biling' never parked a key (check the name; consumerkit "
        "parked list shows every consumer's)")
    async with pg_pool.acquire() as conn:  # the same key parked on a second partition
        await store.park(conn, pg_schema, [parked(3, 1, partition=1)], start=True)
    ambiguous = await cli("parked", "discard", "order-7", "--consumer", APP, *db, cwd=app_dir)
    assert ambiguous.code == 1
    assert _one_line(ambiguous.err) == (
        "consumerkit: key 'order-7' is parked on steps/0, steps/1: choose one with --topic "
        "and --partition")
    chosen = await cli("parked", "discard", "order-7", "--consumer", APP, "--topic", "steps",
                       "--partition", "1", *db, cwd=app_dir)
    assert chosen.code == 0, chosen.err
    assert "discarded key 'order-7' of steps/1: 1 records dropped" in chosen.out
    no_app = await cli("parked", "replay", "order-7", "--app", "app_parked:nope", *db,
                       cwd=app_dir)
    assert no_app.code == 1
    assert _one_line(no_app.err) == (
        "consumerkit: module 'app_parked' has no attribute 'nope'")
    usage = await cli("parked", "replay", "order-7", cwd=app_dir)
    assert usage.code == 2
    assert "the following arguments are required: --app" in usage.err


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("consumerkit: "), err
    return lines[0]
