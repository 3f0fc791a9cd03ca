"""The pytest plugin, as a team meets it: a test file using the ``consumerkit_*`` fixtures
passes with no setup, on the configured PostgreSQL or an embedded one."""

from __future__ import annotations

import asyncpg
import pytest

TEAM_TESTS = '''
import asyncpg
from pydantic import BaseModel

from consumerkit import HandlerContext, Postgres, handler
from consumerkit.testing import TestConsumer


class Paid(BaseModel):
    order_id: str


@handler("order.paid")
async def record_payment(event: Paid, ctx: HandlerContext) -> None:
    await ctx.tx.execute("INSERT INTO paid (order_id) VALUES ($1)", event.order_id)


async def test_a_payment_is_recorded_once(consumerkit_dsn, consumerkit_schema):
    with open("schemas.txt", "a") as seen:
        seen.write(consumerkit_schema + "\\n")
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute("CREATE TABLE paid (order_id text NOT NULL)")
        async with TestConsumer([record_payment], postgres=Postgres(
                dsn=consumerkit_dsn, schema=consumerkit_schema)) as kit:
            first = kit.publish(Paid(order_id="o-1"), key="o-1")
            kit.redeliver(first)
            await kit.drain()
        assert await conn.fetchval("SELECT count(*) FROM paid") == 1
        assert len(kit.duplicates) == 1
    finally:
        await conn.close()


async def test_each_test_gets_an_empty_schema(consumerkit_dsn, consumerkit_schema):
    with open("schemas.txt", "a") as seen:
        seen.write(consumerkit_schema + "\\n")
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        assert await conn.fetchval("SELECT current_schema()") == consumerkit_schema
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_tables WHERE schemaname = $1", consumerkit_schema) == 0
    finally:
        await conn.close()


def test_a_topic_on_the_embedded_broker(consumerkit_topic, consumerkit_kafka_bootstrap):
    assert consumerkit_topic(2).startswith("ck-")
    assert consumerkit_kafka_bootstrap
'''


def run_team_suite(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makeini("[pytest]\nasyncio_mode = auto\n"
                     "asyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_payments=TEAM_TESTS)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=240)


async def test_a_team_suite_runs_on_the_configured_services(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, postgres_dsn: str,
    kafka_bootstrap: str,
) -> None:
    monkeypatch.setenv("CONSUMERKIT_TEST_POSTGRES_DSN", postgres_dsn)
    monkeypatch.setenv("CONSUMERKIT_TEST_KAFKA_BOOTSTRAP", kafka_bootstrap)
    result = run_team_suite(pytester)
    result.assert_outcomes(passed=3)
    schemas = (pytester.path / "schemas.txt").read_text().split()
    assert len(set(schemas)) == 2  # one fresh schema per test
    conn = await asyncpg.connect(postgres_dsn)
    try:  # and each dropped afterwards
        assert await conn.fetchval(
            "SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1::text[])", schemas) == 0
    finally:
        await conn.close()


def test_a_team_suite_needs_no_services_at_all(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CONSUMERKIT_TEST_POSTGRES_DSN", raising=False)
    monkeypatch.delenv("CONSUMERKIT_TEST_KAFKA_BOOTSTRAP", raising=False)
    result = run_team_suite(pytester)
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["consumerkit fixtures: postgres embedded, kafka Tansu*"])
