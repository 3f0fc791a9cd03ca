"""``consumerkit relay`` checks its routes: a fixed route's topic must exist at start-up; an
event a template routes to a missing topic is an error naming it, and waits (nothing skipped,
nothing lost) until the topic exists, unless auto-creation is allowed. Its missing-table hint
works when followed as written."""

from __future__ import annotations

import asyncio
import re
import shlex
import uuid
from pathlib import Path

import asyncpg

from consumerkit.outbox import Outbox, OutboxTable
from consumerkit.testing.services import MakeTopic
from consumerkit.transport.kafka_admin import create_topic

from ..outbox.conftest import pending, read_all, wait_until
from .conftest import PASSWORD, cli, start, terminate, with_password

NO_IDEMPOTENCE = {"CONSUMERKIT_ENABLE_IDEMPOTENCE": "false"}  # Tansu has none


async def _migrated(tmp_path: Path, dsn: str, schema: str) -> None:
    done = await cli("migrate", "--postgres", dsn, "--schema", schema, cwd=tmp_path)
    assert done.code == 0, done.err


async def _one_event(tmp_path: Path, dsn: str, schema: str, pool: asyncpg.Pool,
                     aggregate_type: str) -> OutboxTable:
    """The outbox migrated, with one event of ``aggregate_type`` waiting in it."""
    await _migrated(tmp_path, dsn, schema)
    async with pool.acquire() as conn, conn.transaction():
        await Outbox(schema).add(conn, event_type="order.placed", aggregate_type=aggregate_type,
                                 aggregate_id="o-1", payload={"n": 1})
    return OutboxTable(schema, "outbox")


async def _read_until(proc: asyncio.subprocess.Process, text: str, timeout: float) -> str:
    """The process's stderr up to the first line holding ``text``."""
    assert proc.stderr is not None
    seen: list[str] = []
    async with asyncio.timeout(timeout):
        while not seen or text not in seen[-1]:
            line = await proc.stderr.readline()
            assert line, "".join(seen)  # the process ended first
            seen.append(line.decode())
    return "".join(seen)


async def test_a_fixed_route_to_a_missing_topic_stops_the_relay_in_one_line(
    tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, pg_schema: str,
    make_topic: MakeTopic,
) -> None:
    dsn = with_password(postgres_dsn)
    await _migrated(tmp_path, dsn, pg_schema)
    missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    env = {"CONSUMERKIT_POSTGRES_DSN": dsn,
           "CONSUMERKIT_POSTGRES_SCHEMA": pg_schema, **NO_IDEMPOTENCE}
    done = await cli("relay", "--kafka", kafka_bootstrap, "--route", missing,
                     "--log-level", "warning", cwd=tmp_path, env=env)
    assert done.code == 1
    assert done.err.strip() == (
        f"consumerkit: topics missing on the broker: {missing} (the relay's route): create it "
        "(the relay creates no topic), or let the broker create topics on first use with "
        "auto_create_topics=True (consumerkit relay --auto-create-topics)")
    assert PASSWORD not in done.output
    topic = await make_topic(1)  # a route to a topic that exists: the relay runs
    proc = await start("relay", "--kafka", kafka_bootstrap, "--route", topic,
                       "--log-level", "info", cwd=tmp_path, env=env)
    await _read_until(proc, "started on", 60)
    stopped = await terminate(proc)
    assert stopped.code == 0, stopped.err


async def test_a_templated_route_to_a_missing_topic_waits_for_it_and_loses_nothing(
    tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    dsn = with_password(postgres_dsn)
    missing = f"orders-{uuid.uuid4().hex[:8]}"
    table = await _one_event(tmp_path, dsn, pg_schema, pg_pool, missing)
    env = {"CONSUMERKIT_POSTGRES_DSN": dsn,
           "CONSUMERKIT_POSTGRES_SCHEMA": pg_schema, **NO_IDEMPOTENCE}
    proc = await start("relay", "--kafka", kafka_bootstrap, "--log-level", "info",
                       cwd=tmp_path, env=env)  # the default route: {aggregate_type}
    try:
        err = await _read_until(proc, f"routed to topic {missing}, which is not on the broker",
                                60)
        assert "ERROR" in err.splitlines()[-1], err
        assert await pending(pg_pool, table) == 1  # neither sent nor skipped: it waits
        topics = await _broker_topics(kafka_bootstrap)
        assert missing not in topics  # and the relay created no topic
        await create_topic(kafka_bootstrap, missing, 1)

        async def published() -> bool:
            return await pending(pg_pool, table) == 0

        await wait_until(published, 90, "the relay to publish once the topic exists")
        records = await read_all(kafka_bootstrap, [missing], lambda found: len(found) >= 1)
        assert [r.headers["aggregate_type"] for r in records] == [missing.encode()]
    finally:
        done = await terminate(proc)
    assert done.code == 0, done.err
    assert "Traceback" not in done.err


async def test_auto_creation_when_the_operator_allows_it(
    tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    dsn = with_password(postgres_dsn)
    created = f"auto-{uuid.uuid4().hex[:8]}"
    table = await _one_event(tmp_path, dsn, pg_schema, pg_pool, created)
    env = {"CONSUMERKIT_POSTGRES_DSN": dsn,
           "CONSUMERKIT_POSTGRES_SCHEMA": pg_schema,
           "CONSUMERKIT_AUTO_CREATE_TOPICS": "true", **NO_IDEMPOTENCE}
    proc = await start("relay", "--kafka", kafka_bootstrap, cwd=tmp_path, env=env)

    async def published() -> bool:
        return await pending(pg_pool, table) == 0

    try:
        await wait_until(published, 60, "the relay to publish to a topic made on first use")
    finally:
        done = await terminate(proc)
    assert done.code == 0, done.err
    assert created in await _broker_topics(kafka_bootstrap)
    assert "not on the broker" not in done.err


async def test_the_missing_table_hint_works_as_written(
    tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, pg_schema: str,
    make_topic: MakeTopic,
) -> None:
    dsn = with_password(postgres_dsn)
    topic = await make_topic(1)
    relay = ["relay", "--postgres", dsn, "--schema", pg_schema, "--table", "billing_outbox",
             "--kafka", kafka_bootstrap, "--route", topic, "--log-level", "info"]
    env = NO_IDEMPOTENCE
    done = await cli(*relay, cwd=tmp_path, env=env)
    assert done.code == 1
    line = done.err.strip()
    assert line.startswith(f"consumerkit: no outbox table {pg_schema}.billing_outbox: run `"), line
    assert "--outbox-table billing_outbox" in line
    assert PASSWORD not in done.output
    # follow the hint literally: its command, with the same --postgres and --schema
    hint = re.search(r"`consumerkit ([^`]+)`", line)
    assert hint is not None, line
    assert "with the same --postgres and --schema" in line
    migrated = await cli(*shlex.split(hint.group(1)), "--postgres", dsn, "--schema", pg_schema,
                         cwd=tmp_path)
    assert migrated.code == 0, migrated.err
    proc = await start(*relay, cwd=tmp_path, env=env)
    await _read_until(proc, "started on", 60)
    stopped = await terminate(proc)
    assert stopped.code == 0, stopped.err


async def _broker_topics(bootstrap: str) -> set[str]:
    from consumerkit.cli.check_broker import reach_broker

    return await reach_broker(bootstrap, {})
