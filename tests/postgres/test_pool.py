"""The consumer's connection pool on both servers: the connections a consumer will use at once
are opened at start-up, and a server that cannot give them says so then, in one line."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from consumerkit.engine.lifecycle import open_pool
from consumerkit.errors import StartupError

from .conftest import Conn


@pytest.fixture
async def limited(server_dsn: str, conn: Conn) -> AsyncIterator[str]:
    """The DSN of a LOGIN role allowed two connections at once, dropped afterwards."""
    role = f"ck_pool_{uuid.uuid4().hex[:8]}"
    await conn.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 2')
    parts = urlsplit(server_dsn)
    try:
        yield urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rpartition('@')[2]}"))
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


async def test_a_server_short_of_connections_fails_the_start_in_one_line(limited: str) -> None:
    with pytest.raises(StartupError) as info:
        await open_pool(limited, "pool-test", 6, warm=4)
    message = str(info.value)
    assert "cannot connect to PostgreSQL" in message
    assert "too many connections" in message
    assert "\n" not in message
    pool = await open_pool(limited, "pool-test", 6, warm=2)  # within the limit: fine
    await pool.close()
