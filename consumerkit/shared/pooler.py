"""Every asyncpg pool and connection consumerkit opens, built from one place, so that what a
connection pooler in front of PostgreSQL needs is decided once.

``pooler`` says what stands between the client and PostgreSQL:

- ``none`` (a direct connection) and ``session`` (PgBouncer's ``pool_mode = session``, RDS
  Proxy without pinning): each client connection keeps one backend, so asyncpg's defaults
  hold: a cache of named prepared statements, and a pool that resets a released connection
  with ``pg_advisory_unlock_all()``, ``CLOSE ALL``, ``UNLISTEN *`` and ``RESET ALL``.
- ``transaction`` (PgBouncer's ``pool_mode = transaction``, Supavisor, pgcat): a backend is
  lent for one transaction, then serves other clients. A named prepared statement would stay
  on a backend this client may never see again, and be found there by another client that
  names its own the same way (``prepared statement "__asyncpg_stmt_1__" already exists``):
  the statement cache is off (``statement_cache_size=0``), so asyncpg prepares every query
  as the unnamed statement, which the next Parse replaces. The pool's reset would run on a
  backend shared with other clients and drop their advisory locks, LISTENs and settings: it
  only rolls back what this client left open.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import asyncpg

Pooler = Literal["none", "session", "transaction"]
POOLERS: tuple[str, ...] = get_args(Pooler)


def connect_options(pooler: Pooler) -> dict[str, Any]:
    """The keyword arguments of :func:`asyncpg.connect` that ``pooler`` needs."""
    if pooler == "transaction":
        # 0 also disables max_cached_statement_lifetime's named statements: nothing cached
        return {"statement_cache_size": 0}
    return {}


async def _rollback_only(conn: asyncpg.Connection[Any]) -> None:
    """The pool's reset behind a transaction pooler: asyncpg has already rolled back an open
    transaction and dropped this client's listener callbacks before calling it; nothing
    session-wide is sent to a backend that other clients share."""


async def create_pool(dsn: str, *, pooler: Pooler, application_name: str, max_size: int,
                      min_size: int = 1, timeout: float = 15,
                      **options: Any) -> asyncpg.Pool:
    """A pool to ``dsn`` as ``pooler`` needs it (``options`` go to :func:`asyncpg.create_pool`:
    ``init``, ``max_inactive_connection_lifetime``...)."""
    if pooler == "transaction":
        options.setdefault("reset", _rollback_only)
    pool = await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, timeout=timeout,
        server_settings={"application_name": application_name[:63]},
        **connect_options(pooler), **options)
    assert pool is not None
    return pool


async def connect(dsn: str, *, pooler: Pooler, application_name: str | None = None,
                  timeout: float = 15) -> asyncpg.Connection[asyncpg.Record]:
    """One connection to ``dsn`` as ``pooler`` needs it."""
    settings = {"application_name": application_name[:63]} if application_name else None
    conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(
        dsn, timeout=timeout, server_settings=settings, **connect_options(pooler))
    return conn
