"""``consumerkit check --handlers``: before a deploy, a parked record, a dead letter and an
unpublished outbox row that the new model cannot take are each named with why (exit status
1); with the upcaster added, the same rows pass. Only what waits is read: a replayed parked
record, a dead letter whose event was applied since, another consumer's dead letter and
another event type's outbox row are left out."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import orjson
import pytest

from consumerkit import DeadLetterEntry, DeadLetterTable, DedupPolicy, Envelope, Outbox
from consumerkit.cli import main
from consumerkit.deadletter.table import encode_headers
from consumerkit.dedup.postgres import PostgresDedupStore
from consumerkit.types import SinkResources

V1 = orjson.dumps({"order_id": "o-1", "amount": 1250})
HEADERS = [("id", b"evt-1"), ("event_type", b"order.created")]


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = await asyncio.to_thread(main, list(argv))  # the CLI runs its own event loop
    out = capsys.readouterr()
    return code, out.out + out.err


async def park(pool: asyncpg.Pool, schema: str, offset: int, replayed: bool) -> None:
    await pool.execute(
        f'INSERT INTO "{schema}".parked_records (consumer, topic, "partition", "offset", key, '
        "value, headers, timestamp_ms, event_id, event_type, reason, detail, replayed_at) "
        "VALUES ('orders', 'orders', 0, $1, 'o-1', $2, $3::jsonb, 0, 'evt-1', "
        "'order.created', 'handler_failed', 'ValueError', "
        "CASE WHEN $4 THEN now() END)", offset, V1, encode_headers(HEADERS), replayed)


async def test_check_finds_what_the_new_model_cannot_take_and_passes_with_an_upcaster(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHECK_TEST_SCHEMA", pg_schema)
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    assert (await run(capsys, "migrate", *db, "--outbox-table", "shop_outbox"))[0] == 0
    await park(pg_pool, pg_schema, 7, replayed=False)
    await park(pg_pool, pg_schema, 3, replayed=True)  # replayed already: not read
    sink = DeadLetterTable()
    await sink.open(SinkResources(pool=pg_pool, schema=pg_schema, kafka_bootstrap="",
                                  kafka_options={}))
    for consumer in ("orders", "billing"):  # billing's dead letter is not ours to check
        await sink.send(DeadLetterEntry(consumer, "orders", 0, 9, b"o-1", V1, HEADERS,
                                        "dead_lettered_by_handler", "not yet"))
    # a dead letter replayed and applied since: its event id is claimed by the consumer
    await sink.send(DeadLetterEntry("orders", "orders", 0, 11, b"o-1", V1, [
        ("id", b"evt-applied"), ("event_type", b"order.created")], "handler_failed", "then"))
    store = PostgresDedupStore(pg_schema, DedupPolicy())
    async with pg_pool.acquire() as conn, conn.transaction():
        await store.claim(conn, "orders", Envelope(
            "evt-applied", "header", "order.created", "o-1", "orders", 0, 12,
            datetime.now(UTC)), "take")
    outbox = Outbox(pg_schema, "shop_outbox")
    async with pg_pool.acquire() as conn, conn.transaction():
        await outbox.add(conn, event_type="order.created", aggregate_type="order",
                         aggregate_id="o-2", payload={"order_id": "o-2", "amount": 5})
        await outbox.add(conn, event_type="order.cancelled", aggregate_type="order",
                         aggregate_id="o-2", payload={"order_id": "o-2"})

    check = ["check", *db, "--outbox-table", "shop_outbox", "--page-size", "1"]
    code, out = await run(capsys, *check, "--handlers", "tests.cli.app_versions:careless")
    assert code == 1, out
    missing = "invalid_payload: total_cents: Field required"
    problems = [line for line in out.splitlines() if line.startswith("PROBLEM")]
    assert problems[0] == f"PROBLEM  parked records of orders: orders/0/7: {missing}"
    assert problems[2] == f"PROBLEM  dead letters of orders: orders/0/9: {missing}"
    assert problems[3] == (
        "PROBLEM  dead letters of orders: 1 of 1 would fail with the new handlers: 1 "
        "invalid_payload (read in pages of 1; 1 applied since (replayed))")
    assert problems[4].startswith(
        f"PROBLEM  unpublished rows of outbox {pg_schema}.shop_outbox: seq ")
    assert problems[4].endswith(missing)
    assert problems[5] == (
        f"PROBLEM  unpublished rows of outbox {pg_schema}.shop_outbox: 1 of 1 would fail "
        "with the new handlers: 1 invalid_payload (read in pages of 1; 1 for other "
        "consumers' event types)")
    assert out.splitlines()[-1] == "6 problems found"

    code, out = await run(capsys, *check, "--handlers", "tests.cli.app_versions:fixed")
    assert code == 0, out
    assert "PROBLEM" not in out
    assert "ok       parked records of orders: 1 decode with the new handlers" in out
    assert "ok       dead letters of orders: 1 decode with the new handlers" in out
    assert out.splitlines()[-1] == "all clear"
    # read-only: the rows are all still there
    assert await pg_pool.fetchval(f'SELECT count(*) FROM "{pg_schema}".shop_outbox') == 2
    assert await pg_pool.fetchval(f'SELECT count(*) FROM "{pg_schema}".dead_letters') == 3


async def test_a_cap_on_rows_is_said(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHECK_TEST_SCHEMA", pg_schema)
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    assert (await run(capsys, "migrate", *db))[0] == 0
    for offset in range(5):
        await park(pg_pool, pg_schema, offset, replayed=False)
    code, out = await run(capsys, "check", *db, "--handlers", "tests.cli.app_versions:fixed",
                          "--page-size", "2", "--max-records", "3")
    assert code == 0, out
    assert ("note     parked records of orders: stopped after 3 rows (--max-records); the "
            "rest were not checked") in out
    assert "ok       parked records of orders: 3 decode with the new handlers (read in " \
           "pages of 2)" in out
