"""``consumerkit check`` warns of an asynchronous standby (seen from the primary), and stops
warning once the standby is synchronous."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg

from tests.cli.conftest import cli
from tests.harness import ReplicatedPostgres

TIMEOUT = 30.0


async def test_check_warns_of_an_asynchronous_standby_until_it_is_synchronous(
        pair: ReplicatedPostgres, tmp_path: Path) -> None:
    db = ["--postgres", pair.dsn, "--schema", "app"]
    assert (await cli("migrate", *db, cwd=tmp_path)).code == 0

    done = await cli("check", *db, cwd=tmp_path)
    assert done.code == 0, done.output  # a warning, not a failed check
    warnings = [line for line in done.out.splitlines() if line.startswith("WARNING")]
    assert warnings == [
        "WARNING  asynchronous standby: standby (synchronous_standby_names is empty); a "
        "failover to it can lose commits already acknowledged (effects, dedup rows, outbox "
        "rows) and leave published events without their source; see "
        "synchronous_standby_names in docs/failover.md"], done.out
    assert done.out.splitlines()[-1] == "all clear (1 warning)"

    conn = await asyncpg.connect(pair.primary_dsn, timeout=10)
    try:
        await conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (standby)'")
        await conn.execute("SELECT pg_reload_conf()")
        async with asyncio.timeout(TIMEOUT):
            while await conn.fetchval("SELECT sync_state FROM pg_stat_replication") != "sync":
                await asyncio.sleep(0.1)
    finally:
        await conn.close()
    done = await cli("check", *db, cwd=tmp_path)
    assert done.code == 0, done.output
    assert "WARNING" not in done.out
    assert "ok       standbys synchronous: standby" in done.out.splitlines()
    assert done.out.splitlines()[-1] == "all clear"
