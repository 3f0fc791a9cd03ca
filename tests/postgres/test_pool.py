"""The consumer's connection pool on both servers: the connections a consumer will use at once
are opened at start-up, and a server that cannot give them says so then, in one line."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from consumerkit.engine.lifecycle import open_pool
from consumerkit.errors import StartupError

from .conftest import Conn

GONE_TIMEOUT = 30.0  # a backend's exit after its client left, on two busy cores


@pytest.fixture
async def limited(server_dsn: str, conn: Conn) -> AsyncIterator[tuple[str, str]]:
    """The DSN and name of a LOGIN role allowed two connections at once, dropped afterwards."""
    role = f"ck_pool_{uuid.uuid4().hex[:8]}"
    await conn.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 2')
    parts = urlsplit(server_dsn)
    try:
        yield (urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}")),
               role)
    finally:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await conn.execute(f'DROP ROLE "{role}"')


async def test_a_pool_opens_the_connections_it_will_use_at_once(server_dsn: str) -> None:
    pool = await open_pool(server_dsn, "pool-test", 6, warm=4)
    try:
        assert pool.get_size() == 4
        assert pool.get_idle_size() == 4
    finally:
        await pool.close()
    lazy = await open_pool(server_dsn, "pool-test", 6)
    try:
        assert lazy.get_size() == 1
    finally:
        await lazy.close()


async def backends_gone(conn: Conn, role: str) -> None:
    """Until the server runs no backend of ``role``: a client's connections closing leaves
    their backends exiting a moment later, and until then they count against its limit."""
    deadline = time.monotonic() + GONE_TIMEOUT
    query = "SELECT count(*) FROM pg_stat_activity WHERE usename = $1"
    while (left := await conn.fetchval(query, role)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert left == 0, f"{left} backends of {role} still running after {GONE_TIMEOUT:g}s"


async def test_a_server_short_of_connections_fails_the_start_in_one_line(
    limited: tuple[str, str], conn: Conn,
) -> None:
    dsn, role = limited
    with pytest.raises(StartupError) as info:
        await open_pool(dsn, "pool-test", 6, warm=4)
    message = str(info.value)
    assert "cannot connect to PostgreSQL" in message
    assert "too many connections" in message
    assert "\n" not in message
    await backends_gone(conn, role)  # the failed pool's two connections, closed
    pool = await open_pool(dsn, "pool-test", 6, warm=2)  # within the limit: fine
    await pool.close()
