"""``consumerkit run`` runs on uvloop when it is installed and not turned off, and says which
loop it runs on (the log line reads the running loop, so it names the loop in use). Once
started it tunes the garbage collector, unless told not to, and says so."""

from __future__ import annotations

import importlib.util
import json
import uuid
from importlib import metadata
from pathlib import Path

import asyncpg
import pytest

from consumerkit.testing.services import MakeTopic

from .conftest import start, terminate, with_password
from .test_run import publish, wait_for

UVLOOP = importlib.util.find_spec("uvloop") is not None


def expected(flag: str | None) -> str:
    if flag == "--no-uvloop":
        return "event loop: asyncio (uvloop turned off)"
    if UVLOOP:
        return f"event loop: uvloop {metadata.version('uvloop')}"
    return "event loop: asyncio (uvloop not installed)"


@pytest.mark.parametrize("flag", [None, "--no-uvloop", "--no-gc-tuning"])
async def test_run_reports_the_loop_it_runs_on(
    flag: str | None, app_dir: Path, postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(1)
    await pg_pool.execute(f'CREATE SCHEMA "{pg_schema}"')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".charges (order_id text NOT NULL, '
                          'amount int NOT NULL)')
    await publish(kafka_bootstrap, topic, 5)
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": topic,
           "CLI_TEST_GROUP": f"cli-{uuid.uuid4().hex[:8]}",
           "CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn)}
    proc = await start("run", "app_consumer:build", "--kafka", kafka_bootstrap,
                       "--log-format", "json", *([flag] if flag else []), cwd=app_dir, env=env)
    # it consumed on that loop: every event applied before the stop
    await wait_for(pg_pool, f'SELECT count(*) FROM "{pg_schema}".charges', 5)
    done = await terminate(proc)
    assert done.code == 0, done.err
    messages = [json.loads(line)["message"] for line in done.err.splitlines()]
    loops = [m for m in messages if m.startswith("event loop: ")]
    assert loops == [expected(flag)], messages
    tuned = [m for m in messages if m.startswith("garbage collector: ")]
    if flag == "--no-gc-tuning":
        assert tuned == [], messages
    else:
        assert len(tuned) == 1, messages
        assert "start-up objects frozen" in tuned[0], messages
        assert "every 50,000 allocations" in tuned[0], messages
