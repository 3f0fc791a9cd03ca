"""``migrate`` and ``check`` through a real PgBouncer in transaction mode (prepared statements
not tracked, as before 1.21) that nobody declared: each command works, and leaves every
backend as it found it, so the next client of the pooler can write; ``check`` finds a
transaction pooler nobody declared, and counts the connections a deployment needs."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import asyncpg

from .conftest import PgBouncer

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.cli.app_tried:consumer"
COMMAND_TIMEOUT = 120


def _command(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """A command in a process of its own: asyncpg names its statements from 1 in each
    process, as the deployment's processes do on the backends they share."""
    return subprocess.run([sys.executable, "-m", "consumerkit", *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)


async def _fresh_client_writes(dsn: str, schema: str) -> None:
    """A new client of the pooler gets a backend as a new session would: writable."""
    conn = await asyncpg.connect(dsn, statement_cache_size=0)
    try:
        assert await conn.fetchval("SHOW default_transaction_read_only") == "off"
        await conn.execute(f'INSERT INTO "{schema}".order_lines VALUES (\'o-1\', 1)')
    finally:
        await conn.close()


async def test_migrate_and_check_work_and_leave_every_backend_writable(
    pgbouncer: Callable[..., PgBouncer], pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    bouncer = pgbouncer(pool_size=1)  # one backend: every client gets the one used before
    env = {**os.environ, "CHECK_TEST_SCHEMA": pg_schema}
    env.pop("CONSUMERKIT_POSTGRES_POOLER", None)  # undeclared: the commands work anyway
    db = ["--postgres", bouncer.dsn, "--schema", pg_schema]
    await pg_pool.execute(f'CREATE SCHEMA "{pg_schema}"; '
                          f'CREATE TABLE "{pg_schema}".order_lines (order_id text, amount int)')
    commands = [["migrate", *db, "--outbox-table", "shop_outbox"],
                ["migrate", *db, "--outbox-table", "shop_outbox"],  # the backend used before
                ["check", *db],
                ["check", *db, "--handlers", APP, "--try-handlers"]]
    for argv in commands:
        done = await asyncio.to_thread(_command, *argv, env=env)
        assert "Traceback" not in done.stderr, (argv, done.stderr)
        assert "refused the connection" not in done.stderr, (argv, done.stderr)
        if argv[0] == "migrate":
            assert done.returncode == 0, (argv, done.stdout, done.stderr)
            assert f"schema {pg_schema} is up to date" in done.stdout
        else:  # the handlers' own tables are missing: problems, not a broken command
            assert done.returncode in (0, 1), (argv, done.stdout, done.stderr)
            assert "PROBLEM" in done.stdout or done.returncode == 0, done.stdout
        await _fresh_client_writes(bouncer.dsn, pg_schema)
    try_out = done.stdout
    assert "handler" in try_out, try_out  # the handlers were tried through the pooler


async def _check(*argv: str) -> tuple[int, str]:
    done = await asyncio.to_thread(_command, "check", *argv, env=dict(os.environ))
    return done.returncode, done.stdout + done.stderr


async def test_check_finds_an_undeclared_transaction_pooler(
    pgbouncer: Callable[..., PgBouncer], direct_postgres_dsn: str, pg_schema: str,
) -> None:
    transaction = pgbouncer(pool_size=2)
    session = pgbouncer(mode="session", pool_size=2)
    code, out = await _check("--postgres", transaction.dsn, "--schema", pg_schema)
    assert code == 1, out
    assert "PROBLEM  PostgreSQL is reached through a pooler in transaction mode (" in out
    assert "but postgres.pooler is none: set CONSUMERKIT_POSTGRES_POOLER=transaction" in out
    # one backend: the second client is lent the one the first gave back, and the proof
    # names it once (not as two backends with the same pid)
    code, out = await _check("--postgres", pgbouncer(pool_size=1).dsn, "--schema", pg_schema)
    assert code == 1, out
    assert re.search(r"in transaction mode \(backend \d+ answered two clients' transactions "
                     r"in turn\)", out), out
    code, out = await _check("--postgres", transaction.dsn, "--schema", pg_schema,
                             "--postgres-pooler", "transaction")
    assert "ok       PostgreSQL is reached through a pooler in transaction mode, as declared" \
        in out
    for dsn, declared in ((direct_postgres_dsn, "none"), (session.dsn, "session")):
        code, out = await _check("--postgres", dsn, "--schema", pg_schema,
                                 "--postgres-pooler", declared)
        assert "ok       each client keeps its PostgreSQL backend " \
            f"(postgres.pooler={declared})" in out, out
        assert "pooler in transaction mode" not in out


async def test_check_counts_the_connections_a_deployment_needs(
    direct_postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    most = int(await pg_pool.fetchval("SHOW max_connections"))
    db = ["--postgres", direct_postgres_dsn, "--schema", pg_schema]
    code, out = await _check(*db, "--processes", "2", "--relays", "1")
    assert "ok       connections needed: 2 consumer process(es) x (limits.concurrency 4 + 3) + " \
        "1 relay(s) x 3 + 1 command = 18, within max_connections " in out, out
    too_many = str(most // 7 + 1)
    code, out = await _check(*db, "--processes", too_many)
    assert code == 1
    assert f"PROBLEM  connections needed: {too_many} consumer process(es) x " \
        "(limits.concurrency 4 + 3) + 0 relay(s) x 3 + 1 command" in out, out
    assert "more than PostgreSQL has room for (max_connections " in out
