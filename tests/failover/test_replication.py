"""The replicated pair the failover tests stand on: a standby held back really misses the
commits made meanwhile, and after promotion the multi-host DSN reaches it."""

from __future__ import annotations

import asyncpg
import pytest

from tests.harness import ReplicatedPostgres


async def _count(dsn: str) -> int:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM t"))
    finally:
        await conn.close()


async def test_commits_made_while_held_back_are_lost_by_the_failover(
        pair: ReplicatedPostgres) -> None:
    conn = await asyncpg.connect(pair.dsn, timeout=10)
    try:
        assert await conn.fetchval("SELECT inet_server_port()") == pair.primary_port
        await conn.execute("CREATE TABLE t (n int PRIMARY KEY)")
        await conn.execute("INSERT INTO t SELECT generate_series(1, 10)")
        pair.wait_caught_up()
        pair.hold_back()
        for n in range(11, 31):  # one transaction each, all committed on the primary
            await conn.execute("INSERT INTO t VALUES ($1)", n)
        assert await conn.fetchval("SELECT count(*) FROM t") == 30
    finally:
        await conn.close()
    standby = pair.standby_port
    pair.kill_primary()
    with pytest.raises(ConnectionRefusedError):
        await asyncpg.connect(pair.primary_dsn, timeout=5)
    pair.promote()

    conn = await asyncpg.connect(pair.dsn, timeout=10)
    try:
        assert await conn.fetchval("SELECT inet_server_port()") == standby == pair.primary_port
        assert await conn.fetchval("SELECT max(n) FROM t") == 10  # the 20 held back are gone
        await conn.execute("INSERT INTO t VALUES (11)")  # and it takes writes
    finally:
        await conn.close()


async def test_a_standby_not_held_back_keeps_every_commit(pair: ReplicatedPostgres) -> None:
    """The control: the same failover without holding back loses nothing that was replayed."""
    conn = await asyncpg.connect(pair.primary_dsn, timeout=10)
    try:
        await conn.execute("CREATE TABLE t (n int PRIMARY KEY)")
        await conn.execute("INSERT INTO t SELECT generate_series(1, 30)")
    finally:
        await conn.close()
    pair.wait_caught_up()
    pair.kill_primary()
    pair.promote()
    assert await _count(pair.dsn) == 30


async def test_before_promotion_the_multi_host_dsn_finds_no_writable_server(
        pair: ReplicatedPostgres) -> None:
    pair.kill_primary()
    # the dead primary refuses, and the standby is read-only
    with pytest.raises(ConnectionRefusedError):
        await asyncpg.connect(pair.dsn, timeout=5)
    assert await _count_tables(pair.standby_dsn) >= 0  # the standby itself still answers


async def _count_tables(dsn: str) -> int:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        assert await conn.fetchval("SELECT pg_is_in_recovery()") is True
        return int(await conn.fetchval("SELECT count(*) FROM pg_tables"))
    finally:
        await conn.close()


async def test_after_a_rebuild_the_pair_fails_over_again_behind_the_same_dsn(
        pair: ReplicatedPostgres) -> None:
    """The torture fault fails over more than once: the old primary's port gets a new
    standby of the new primary, and ``dsn`` still reaches whichever takes writes."""
    ports = {pair.primary_port, pair.standby_port}
    dsn = pair.dsn
    pair.kill_primary()
    pair.promote()
    pair.rebuild_standby()
    assert {pair.primary_port, pair.standby_port} == ports
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute("CREATE TABLE t (n int PRIMARY KEY)")
        await conn.execute("INSERT INTO t VALUES (1)")
        pair.wait_caught_up()
        pair.hold_back()
        await conn.execute("INSERT INTO t VALUES (2)")
    finally:
        await conn.close()
    pair.restart_primary()  # a crash of the primary alone loses nothing
    assert await _count(dsn) == 2
    pair.release()
    pair.wait_caught_up()  # the standby streams again from the restarted primary
    pair.hold_back()
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute("INSERT INTO t VALUES (3)")
    finally:
        await conn.close()
    pair.kill_primary()
    pair.promote()
    assert pair.failovers == 2
    assert await _count(dsn) == 2  # 3 was held back; 2 reached the standby after the restart
