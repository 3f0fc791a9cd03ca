"""``consumerkit check --processes N`` counts the lock-table entries the deployment's claims
hold against the server's lock table: measured on the partitions present, projected to a
full window, with the numbers in the message."""

from __future__ import annotations

import re
from datetime import timedelta

import asyncpg
import pytest

from consumerkit import migrate
from consumerkit.dedup.partitions import maintain
from consumerkit.dedup.policy import DedupPolicy

from .test_migrate_check import run

HOURLY = DedupPolicy(partition_interval=timedelta(hours=1))
MEASURED = re.compile(r"measured (\d+) over the (\d+) dedup partition\(s\) present")
PER_CLAIM = re.compile(r" x (\d+) per claim")


async def _server_size(pool: asyncpg.Pool) -> tuple[int, int, int]:
    row = await pool.fetchrow(
        "SELECT current_setting('max_locks_per_transaction')::int AS l, "
        "current_setting('max_connections')::int AS c, "
        "current_setting('max_prepared_transactions')::int AS p")
    assert row is not None
    return row["l"], row["c"], row["p"]


async def test_a_deployment_on_default_settings_fits_the_lock_table(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Twelve processes at the default concurrency over the default daily partitions."""
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
    per_tx, connections, prepared = await _server_size(pg_pool)
    _code, out = await run(capsys, "check", "--postgres", postgres_dsn, "--schema", pg_schema,
                          "--processes", "12")
    line = next(x for x in out.splitlines() if "lock-table entries" in x)
    print(line)
    assert line.startswith("ok       lock-table entries the claims hold: 12 consumer "
                           "process(es) x 4 transaction(s) in flight (limits.concurrency) "
                           "x "), out
    assert (f"max_locks_per_transaction {per_tx} x (max_connections {connections} + "
            f"max_prepared_transactions {prepared})") in line
    # the claim's own rows roll back: nothing measured stays behind
    assert await pg_pool.fetchval(f'SELECT count(*) FROM "{pg_schema}".processed_events') == 0


async def test_an_hourly_window_too_big_for_the_lock_table_is_a_problem(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Hourly partitions over a week: a claim probes some 170 partitions and their indexes,
    so a few processes overflow the lock table (three on a default server) although their
    connections fit. The measure follows the partitions present: three past hours more,
    three entries more each (a partition and its two indexes)."""
    db = ["--postgres", postgres_dsn, "--schema", pg_schema, "--interval", "1h"]
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema, HOURLY)
    per_tx, connections, prepared = await _server_size(pg_pool)
    _code, out = await run(capsys, "check", *db, "--processes", "1")
    one = next(x for x in out.splitlines() if "lock-table entries" in x)
    per_claim = PER_CLAIM.search(one)
    assert per_claim is not None, one
    # the fewest processes whose claims the server's lock table cannot hold
    processes = per_tx * (connections + prepared) // (4 * int(per_claim[1])) + 1
    code, out = await run(capsys, "check", *db, "--processes", str(processes))
    line = next(x for x in out.splitlines() if "lock-table entries" in x)
    print(line)
    assert code == 1
    assert line.startswith(f"PROBLEM  lock-table entries the claims hold: {processes} "
                           "consumer process(es) x 4 transaction(s) in flight (limits.concurrency) "
                           "x "), out
    assert "more than the server's lock table has room for" in line
    assert "+ 3 for each of the" in line
    assert f"connections needed: {processes} consumer process(es)" in out  # they fit
    assert "PROBLEM  connections" not in out
    before = MEASURED.search(line)
    assert before is not None
    async with pg_pool.acquire() as conn:
        now = await conn.fetchval("SELECT now()")
        await maintain(conn, pg_schema, HOURLY, now=now - timedelta(hours=4))
    code, out = await run(capsys, "check", *db, "--processes", str(processes))
    after = MEASURED.findall(out)[-1]  # (the line printed above is in ``out`` too)
    added = int(after[1]) - int(before[2])
    assert added == 4, (line, out)  # the hours from 5 to 2 before the current one
    assert int(after[0]) - int(before[1]) == 3 * added
