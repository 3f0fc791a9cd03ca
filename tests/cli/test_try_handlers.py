"""``consumerkit check --handlers ... --try-handlers``: before a deploy, a handler whose table,
column or privilege is missing is named with the database's message (exit status 1), a batch
handler and ``ctx.defer`` included; once the tables exist the check passes. Nothing is
written: the statements are prepared and explained, never run. A handler that raises on the
empty results, or whose model no instance can be built for, is said without failing."""

from __future__ import annotations

import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from consumerkit.cli.dry_connection import DryConnection, NotTried
from consumerkit.registry import resolve
from tests.cli import app_tried
from tests.cli.test_check_handlers import park, run

APP = "tests.cli.app_tried:consumer"


def problems(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("PROBLEM")]


async def counts(pool: asyncpg.Pool, schema: str) -> dict[str, int]:
    tables = ("parked_records", "dead_letters", "shop_outbox", "charges", "order_notes",
              "order_lines", "audit")
    found = {t for t in tables if await pool.fetchval("SELECT to_regclass($1)",
                                                       f'"{schema}".{t}') is not None}
    return {t: await pool.fetchval(f'SELECT count(*) FROM "{schema}".{t}') for t in found}


async def test_a_missing_table_and_column_are_named_and_nothing_is_written(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHECK_TEST_SCHEMA", pg_schema)
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    assert (await run(capsys, "migrate", *db, "--outbox-table", "shop_outbox"))[0] == 0
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".order_notes (order_id text)')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".order_lines (order_id text, amount int)')
    await park(pg_pool, pg_schema, 7, replayed=False)  # an order.created waiting: tried on it
    check = ["check", *db, "--handlers", APP]

    code, out = await run(capsys, *check)  # without the flag, the handlers are not run
    assert code == 0, out
    assert "handler" not in out.lower().replace("new handlers", "")

    before = await counts(pg_pool, pg_schema)
    code, out = await run(capsys, *check, "--try-handlers")
    assert code == 1, out
    assert sorted(problems(out)) == sorted([
        f"PROBLEM  handler {_name('note_orders')} (order.created), tried on parked records "
        f'of orders: orders/0/7: 42703 column "note" of relation "order_notes" does not '
        "exist",
        f"PROBLEM  handler {_name('record_charge')} (payment.captured), tried on a built "
        f'instance: 42P01 relation "{pg_schema}.charges" does not exist',
        # it catches the error itself: its transaction is aborted all the same
        f"PROBLEM  handler {_name('audit')} (order.shipped), tried on a built instance: "
        f'42P01 relation "{pg_schema}.audit" does not exist',
    ])
    # built from the model's example; the row it reads is not there (no row ever is)
    assert (f"note     handler {_name('cancel')} (order.cancelled) could not be tried on "
            "a built instance: LookupError: no order o-9") in out
    assert (f"note     handler {_name('refund')} (refund.issued) could not be tried: no "
            "waiting record of its type and no instance of Refund could be built") in out
    assert "3 problems found" in out.splitlines()  # the handler's log line goes to stderr
    assert await counts(pg_pool, pg_schema) == before

    await pg_pool.execute(f'ALTER TABLE "{pg_schema}".order_notes ADD COLUMN note text')
    await pg_pool.execute(
        f'CREATE TABLE "{pg_schema}".charges (order_id text, amount_cents bigint)')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".audit (order_id text)')
    before = await counts(pg_pool, pg_schema)
    code, out = await run(capsys, *check, "--try-handlers")
    assert code == 0, out
    assert (f"ok       handler {_name('note_orders')} (order.created), tried on parked "
            "records of orders: orders/0/7: 2 statements checked, none refused") in out
    # its INSERT and the outbox's insert of ctx.publish: checked, not run
    assert (f"ok       handler {_name('record_charge')} (payment.captured), tried on a "
            "built instance: 2 statements checked, none refused") in out
    assert out.splitlines()[-1] == "all clear"
    after = await counts(pg_pool, pg_schema)
    assert after == before
    assert after["charges"] == after["order_notes"] == after["shop_outbox"] == 0
    assert after["audit"] == after["order_lines"] == 0


async def test_a_missing_privilege_is_named(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHECK_TEST_SCHEMA", pg_schema)
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    assert (await run(capsys, "migrate", *db, "--outbox-table", "shop_outbox"))[0] == 0
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".order_notes (order_id text, note text)')
    await pg_pool.execute(
        f'CREATE TABLE "{pg_schema}".charges (order_id text, amount_cents bigint)')
    role = f"ck_reader_{uuid.uuid4().hex[:8]}"
    await pg_pool.execute(f"CREATE ROLE {role} LOGIN")
    try:
        await pg_pool.execute(f'GRANT USAGE ON SCHEMA "{pg_schema}" TO {role}')
        await pg_pool.execute(f'GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA "{pg_schema}" '
                              f"TO {role}")
        await pg_pool.execute(f'REVOKE INSERT ON "{pg_schema}".charges FROM {role}')
        parts = urlsplit(postgres_dsn)
        as_role = urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
        code, out = await run(capsys, "check", "--postgres", as_role, "--schema", pg_schema,
                              "--handlers", APP, "--try-handlers")
        assert code == 1, out
        assert (f"PROBLEM  handler {_name('record_charge')} (payment.captured), tried on a "
                "built instance: 42501 permission denied for table charges") in out
    finally:
        await pg_pool.execute(f'DROP OWNED BY {role}')
        await pg_pool.execute(f"DROP ROLE {role}")


async def test_try_handlers_needs_handlers(
    postgres_dsn: str, pg_schema: str, capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = await run(capsys, "check", "--postgres", postgres_dsn, "--schema", pg_schema,
                          "--try-handlers")
    assert code != 0
    assert "--try-handlers needs --handlers MODULE:ATTR" in out


def _name(func: str) -> str:
    return resolve(getattr(app_tried, func)).name


async def test_a_copy_is_checked_as_an_insert_and_nothing_is_copied(
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    await pg_pool.execute(f'CREATE SCHEMA "{pg_schema}"')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".lines (order_id text, amount int)')
    async with pg_pool.acquire() as conn:
        dry = DryConnection(conn)
        async with conn.transaction(readonly=True):
            assert await dry.copy_records_to_table(
                "lines", records=[("o-1", 5)], columns=["order_id", "amount"],
                schema_name=pg_schema) == "COPY 0"
        with pytest.raises(asyncpg.UndefinedColumnError, match='column "total"'):
            async with conn.transaction(readonly=True):
                await dry.copy_records_to_table("lines", records=[("o-1", 5)],
                                                columns=["order_id", "total"],
                                                schema_name=pg_schema)
        with pytest.raises(NotTried, match="copy_from_query is not tried"):
            await dry.copy_from_query("SELECT 1", output="/dev/null")
    assert await pg_pool.fetchval(f'SELECT count(*) FROM "{pg_schema}".lines') == 0
