"""The commands with a multi-host DSN (``target_session_attrs=read-write``): ``migrate`` and
``check`` reach the server that takes writes, ``run`` goes on after a failover, and a DSN
whose every host is down or read-only is one line naming it, its password hidden."""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import uuid
from pathlib import Path

import asyncpg

from consumerkit.testing.services import MakeTopic
from tests.cli.conftest import HERE, PASSWORD, cli, environment, with_password
from tests.cli.test_run import publish
from tests.harness import ReplicatedPostgres

TIMEOUT = 90.0


async def _count(dsn: str, sql: str, at_least: int) -> int:
    """Once ``sql`` counts at least ``at_least`` (connecting again while the server is away)."""
    found = -1
    async with asyncio.timeout(TIMEOUT):
        while found < at_least:
            try:
                conn = await asyncpg.connect(dsn, timeout=5)
            except OSError:
                await asyncio.sleep(0.2)
                continue
            try:
                found = int(await conn.fetchval(sql))
            finally:
                await conn.close()
            await asyncio.sleep(0.1)
    return found


async def test_migrate_and_check_reach_the_writable_server(
        pair: ReplicatedPostgres, tmp_path: Path) -> None:
    dsn = with_password(pair.dsn)
    done = await cli("migrate", "--postgres", dsn, "--schema", "app", cwd=tmp_path)
    assert done.code == 0, done.output
    assert "schema app is up to date" in done.out
    done = await cli("check", "--postgres", dsn, "--schema", "app", cwd=tmp_path)
    assert "ok       tables of schema app present" in done.out, done.output
    assert PASSWORD not in done.output
    conn = await asyncpg.connect(pair.primary_dsn, timeout=10)
    try:
        assert await conn.fetchval("SELECT to_regclass('app.dead_letters') IS NOT NULL")
    finally:
        await conn.close()


async def test_no_writable_host_is_one_line_without_the_password(
        pair: ReplicatedPostgres, tmp_path: Path) -> None:
    pair.kill_primary()  # the standby answers, but is read-only
    dsn = with_password(pair.dsn)
    done = await cli("migrate", "--postgres", dsn, "--schema", "app", cwd=tmp_path)
    assert done.code == 1
    assert "Traceback" not in done.output
    assert PASSWORD not in done.output
    line = done.err.strip()
    assert "\n" not in line
    assert line.startswith("consumerkit: cannot connect to PostgreSQL at "
                           f"postgresql://postgres:***@127.0.0.1:{pair.primary_port},"
                           f"127.0.0.1:{pair.standby_port}/postgres"), line


async def test_run_goes_on_after_a_failover(
        pair: ReplicatedPostgres, tmp_path: Path, kafka_bootstrap: str,
        make_topic: MakeTopic) -> None:
    shutil.copy(HERE / "app_consumer.py", tmp_path / "app_consumer.py")
    dsn = with_password(pair.dsn)
    done = await cli("migrate", "--postgres", dsn, "--schema", "app", cwd=tmp_path)
    assert done.code == 0, done.output
    conn = await asyncpg.connect(pair.dsn, timeout=10)
    try:
        await conn.execute("CREATE TABLE app.charges (order_id text NOT NULL, amount int)")
    finally:
        await conn.close()
    topic = await make_topic(2)
    env = {"CLI_TEST_SCHEMA": "app", "CLI_TEST_TOPIC": topic,
           "CLI_TEST_GROUP": f"cli-{uuid.uuid4().hex[:8]}", "CONSUMERKIT_POSTGRES_DSN": dsn}
    log = tmp_path / "run.log"
    with log.open("wb") as sink:  # read while it runs: has it met the failover yet?
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "consumerkit", "run", "app_consumer:build", "--kafka",
            kafka_bootstrap, cwd=tmp_path, env=environment(env), stdout=sink, stderr=sink)
    try:
        await publish(kafka_bootstrap, topic, 30)
        charges = "SELECT count(*) FROM app.charges"
        assert await _count(pair.dsn, charges, 30) == 30
        await asyncio.to_thread(pair.wait_caught_up)
        await asyncio.to_thread(pair.kill_primary)
        await publish(kafka_bootstrap, topic, 60)  # the first 30 again, and 30 new ones
        async with asyncio.timeout(TIMEOUT):  # it meets the failover with records to apply
            while "database unavailable" not in log.read_text():
                await asyncio.sleep(0.1)
        await asyncio.to_thread(pair.promote)
        await _count(pair.dsn, charges, 60)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), TIMEOUT)
    output = log.read_text()
    assert code == 0, output
    assert "Traceback" not in output, output
    assert PASSWORD not in output
    conn = await asyncpg.connect(pair.primary_dsn, timeout=10)
    try:
        assert await conn.fetchval("SELECT count(*) FROM app.charges") == 60
        assert await conn.fetchval("SELECT count(DISTINCT order_id) FROM app.charges") == 60
    finally:
        await conn.close()
