"""``consumerkit run MODULE:ATTR`` as a subprocess: it consumes a topic, a SIGTERM drains and
exits with 0, nothing in flight is lost, and every log line is JSON when asked."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from pathlib import Path

import asyncpg
import orjson

from consumerkit.testing.services import MakeTopic
from consumerkit.transport.kafka import KafkaProducer

from ..brokers import PRODUCER_OPTIONS
from .conftest import PASSWORD, cli, finish, start, terminate, with_password

ORDERS = 60


async def publish(bootstrap: str, topic: str, orders: int, copies: int = 1) -> None:
    producer = KafkaProducer(bootstrap, dict(PRODUCER_OPTIONS))
    await producer.start()
    try:
        for n in range(orders):
            for _ in range(copies):
                await producer.send(
                    topic, key=f"order-{n}".encode(),
                    value=orjson.dumps({"order_id": f"order-{n}", "amount": n}),
                    headers=[("id", f"{topic}-{n}".encode()), ("event_type", b"charge")])
    finally:
        await producer.stop()


async def wait_for(pool: asyncpg.Pool, sql: str, at_least: int, timeout: float = 60) -> int:
    async with asyncio.timeout(timeout):
        while (found := await pool.fetchval(sql)) < at_least:
            await asyncio.sleep(0.1)
    return int(found)


async def test_run_consumes_drains_on_sigterm_and_loses_nothing(
    app_dir: Path, postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic,
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(2)
    await pg_pool.execute(f'CREATE SCHEMA "{pg_schema}"')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".charges (order_id text NOT NULL, '
                          'amount int NOT NULL)')
    await publish(kafka_bootstrap, topic, ORDERS, copies=2)
    dsn = with_password(postgres_dsn)
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": topic,
           "CLI_TEST_GROUP": f"cli-{uuid.uuid4().hex[:8]}", "CLI_TEST_DELAY": "0.2",
           "CONSUMERKIT_POSTGRES_DSN": dsn}
    # the DSN from the variable, the broker from a flag; the module is found in the cwd
    proc = await start("run", "app_consumer:build", "--kafka", kafka_bootstrap,
                       "--log-format", "json", "--log-level", "DEBUG", cwd=app_dir, env=env)
    charges = f'SELECT count(*) FROM "{pg_schema}".charges'
    await wait_for(pg_pool, charges, 5)
    done = await terminate(proc)  # handlers are sleeping in open transactions
    assert done.code == 0, done.err
    assert "Traceback" not in done.err
    lines = done.err.splitlines()
    assert lines
    for line in lines:
        entry = json.loads(line)
        assert {"time", "level", "logger", "message"} <= entry.keys(), line
    messages = [json.loads(line)["message"] for line in lines]
    assert any("SIGTERM received" in m for m in messages)
    assert any("stopped" in m for m in messages)
    assert PASSWORD not in done.output

    dedup = f'SELECT count(*) FROM "{pg_schema}".processed_events_ids'
    # what was in flight at the signal finished and committed with its dedup row
    assert await pg_pool.fetchval(charges) == await pg_pool.fetchval(dedup) >= 5

    # a second run (the async factory this time) takes up where the first stopped
    await publish(kafka_bootstrap, topic, 2 * ORDERS)  # the first ORDERS again, and as many new
    env["CLI_TEST_DELAY"] = "0"
    proc = await start("run", "app_consumer:build_async", "--kafka", kafka_bootstrap,
                       cwd=app_dir, env=env)
    await wait_for(pg_pool, charges, 2 * ORDERS)
    await wait_for(pg_pool, dedup, 2 * ORDERS)
    done = await terminate(proc)
    assert done.code == 0, done.err
    assert PASSWORD not in done.output
    rows = await pg_pool.fetch(f'SELECT order_id, count(*) AS n FROM "{pg_schema}".charges '
                               "GROUP BY order_id")
    assert len(rows) == 2 * ORDERS  # every order charged ...
    assert {r["n"] for r in rows} == {1}  # ... once, duplicates and the stop notwithstanding


async def test_run_without_a_broker_names_the_setting(
    app_dir: Path, postgres_dsn: str, pg_schema: str,
) -> None:
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": "orders",
           "CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn)}
    done = await cli("run", "app_consumer:consumer", cwd=app_dir, env=env)
    assert done.code == 1
    assert done.err.strip().splitlines()[-1] == (
        "consumerkit: no Kafka bootstrap servers: pass kafka=Kafka(bootstrap=...), or set "
        "CONSUMERKIT_KAFKA_BOOTSTRAP (consumerkit run --kafka)")
    assert "Traceback" not in done.err


async def test_run_with_an_unreachable_broker_is_one_line(
    app_dir: Path, postgres_dsn: str, pg_schema: str,
) -> None:
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": "orders"}
    done = await cli("run", "app_consumer:consumer", "--kafka", "127.0.0.1:1",
                     "--postgres", with_password(postgres_dsn), cwd=app_dir, env=env)
    assert done.code == 1, done.err
    assert done.err.strip().splitlines()[-1] == (
        "consumerkit: cannot reach the Kafka broker at 127.0.0.1:1: no broker answered (is it "
        "running, and is the address right?)")
    assert "Traceback" not in done.err
    assert PASSWORD not in done.output


async def test_an_idle_consumer_stops_on_sigterm(
    app_dir: Path, postgres_dsn: str, pg_schema: str, kafka_bootstrap: str,
    make_topic: MakeTopic,
) -> None:
    topic = await make_topic(1)
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": topic,
           "CONSUMERKIT_KAFKA_BOOTSTRAP": kafka_bootstrap,
           "CONSUMERKIT_POSTGRES_DSN": postgres_dsn, "CONSUMERKIT_LOG_LEVEL": "info"}
    proc = await start("run", "app_consumer:consumer", cwd=app_dir, env=env)
    assert proc.stderr is not None
    async with asyncio.timeout(60):  # the consumer logs its start once it is running
        while b"started on" not in await proc.stderr.readline():
            pass
    done = await terminate(proc)
    assert done.code == 0, done.err
    assert "stopped" in done.err


async def test_a_second_signal_abandons_in_flight_work_without_losing_it(
    app_dir: Path, postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic,
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(1)
    await pg_pool.execute(f'CREATE SCHEMA "{pg_schema}"')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".charges (order_id text NOT NULL, '
                          'amount int NOT NULL)')
    await publish(kafka_bootstrap, topic, 20)
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": topic,
           "CLI_TEST_GROUP": f"cli-{uuid.uuid4().hex[:8]}", "CLI_TEST_DELAY": "30",
           "CONSUMERKIT_POSTGRES_DSN": postgres_dsn, "CONSUMERKIT_LOG_LEVEL": "INFO"}
    proc = await start("run", "app_consumer:consumer", "--kafka", kafka_bootstrap,
                       cwd=app_dir, env=env)
    assert proc.stderr is not None
    async with asyncio.timeout(60):  # four handlers asleep in open transactions
        while await pg_pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction' "
                "AND application_name LIKE 'consumerkit:cli-%'") < 4:
            await asyncio.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        while b"finishing in-flight work" not in await proc.stderr.readline():
            pass
    proc.send_signal(signal.SIGTERM)  # the handlers would sleep 30 s more: don't wait
    done = await finish(proc, timeout=20)
    assert done.code == 0, done.err
    assert "abandoning in-flight work now" in done.err
    assert "Traceback" not in done.err
    # abandoned transactions rolled back: no effect without its dedup row, so a later run
    # applies them
    charges = await pg_pool.fetchval(f'SELECT count(*) FROM "{pg_schema}".charges')
    claims = await pg_pool.fetchval(f'SELECT count(*) FROM "{pg_schema}".processed_events_ids')
    assert charges == claims == 0
