"""``postgres_pooler``: what each mode asks of asyncpg, checked on a real PostgreSQL. Behind a
transaction pooler no named prepared statement is left on a backend, and the pool's reset
leaves the backend's session state (another client's advisory locks) alone; the consumer and
the relay take the setting, and refuse a mode they do not know."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import pytest

from consumerkit import Consumer, Postgres
from consumerkit.cli.errors import database_error
from consumerkit.errors import ConfigurationError
from consumerkit.outbox import Relay
from consumerkit.outbox.event import OutboxEvent
from consumerkit.settings import ConsumerSettings, RelaySettings
from consumerkit.shared.pooler import Pooler, connect, create_pool

from ..cli.app_consumer import charge

LOCK = 735_001


async def _prepared(conn: asyncpg.Connection[asyncpg.Record] | asyncpg.Pool) -> int:
    count: int = await conn.fetchval("SELECT count(*) FROM pg_prepared_statements")
    return count


async def test_transaction_mode_leaves_no_named_statement_on_the_backend(
    direct_postgres_dsn: str,
) -> None:
    modes: tuple[tuple[Pooler, bool], ...] = (("none", True), ("transaction", False))
    for pooler, expected in modes:
        conn = await connect(direct_postgres_dsn, pooler=pooler)
        try:
            await conn.fetchval("SELECT $1::int + 1", 1)
            await conn.fetchval("SELECT $1::int + 1", 2)
            assert (await _prepared(conn) > 0) is expected, pooler
        finally:
            await conn.close()


async def test_transaction_mode_pool_reset_keeps_the_backends_session_state(
    direct_postgres_dsn: str,
) -> None:
    """A backend behind a transaction pooler may hold another client's session advisory lock
    (or LISTEN, or setting): releasing a connection must not drop it, as asyncpg's default
    reset (``pg_advisory_unlock_all()``, ``UNLISTEN *``, ``RESET ALL``) would."""
    modes: tuple[tuple[Pooler, bool], ...] = (("none", False), ("transaction", True))
    for pooler, kept in modes:
        pool = await create_pool(direct_postgres_dsn, pooler=pooler, max_size=1,
                                 application_name="pooler-test")
        try:
            async with pool.acquire() as conn:
                pid = await conn.fetchval("SELECT pg_backend_pid()")
                await conn.execute(f"SELECT pg_advisory_lock({LOCK})")
                await conn.execute("SET application_name = 'set-by-another-client'")
            async with pool.acquire() as conn:  # the same backend: max_size=1
                assert await conn.fetchval("SELECT pg_backend_pid()") == pid
                held = await conn.fetchval(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                    "AND objid = $1 AND pid = pg_backend_pid()", LOCK)
                name = await conn.fetchval("SHOW application_name")
                assert (held == 1) is kept, pooler
                assert (name == "set-by-another-client") is kept, pooler
                await conn.execute("SELECT pg_advisory_unlock_all()")
        finally:
            await pool.close()


def test_the_consumer_takes_the_setting_and_refuses_an_unknown_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CONSUMERKIT_POSTGRES_POOLER", "transaction")
    settings = ConsumerSettings()
    consumer = Consumer(name="c", handlers=[charge], topics=["t"], postgres=settings.postgres)
    assert consumer.postgres_pooler == "transaction"
    with pytest.raises(ConfigurationError, match=r"Postgres\.pooler must be 'none', 'session'"):
        Postgres(pooler="statement")  # type: ignore[arg-type]
    assert RelaySettings().postgres.pooler == "transaction"


class _NoSink:
    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        return [None for _ in events]


def test_the_relay_behind_a_transaction_pooler_leases_its_slots_and_polls() -> None:
    relay = Relay(Postgres(dsn="postgresql://db/x", pooler="transaction"), _NoSink())
    assert relay.notify is False
    assert relay._leases is not None
    assert Relay(Postgres(dsn="postgresql://db/x", pooler="session"), _NoSink())._leases is None
    with pytest.raises(ConfigurationError, match="a relay needs a DSN"):
        Relay(Postgres(pooler="transaction"), _NoSink())


def test_an_error_after_connecting_is_not_called_a_refusal() -> None:
    """Through PgBouncer 1.18 a backend that still holds another client's prepared statement
    fails the first statement: that is no refusal of the connection."""
    dsn = "postgresql://app@db:6432/shop"
    duplicate = asyncpg.DuplicatePreparedStatementError(
        'prepared statement "__asyncpg_stmt_1__" already exists')
    error = database_error(duplicate, dsn)
    assert error is not None
    assert str(error) == (f"PostgreSQL at {dsn} failed while connecting: "
                          "DuplicatePreparedStatementError: prepared statement "
                          '"__asyncpg_stmt_1__" already exists')
    refused = database_error(asyncpg.InvalidPasswordError("password authentication failed"),
                             dsn)
    assert refused is not None
    assert "refused the connection" in str(refused)
