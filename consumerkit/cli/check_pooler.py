"""``consumerkit check``: is PostgreSQL reached through a pooler in transaction mode, and did
the deployment say so (``Postgres(pooler=...)``, ``--postgres-pooler``)?

Two client connections, A and B. A asks for its backend's pid outside a transaction; then B
opens a transaction and asks for its own. Directly or through a session pooler each client
keeps its backend, so B's differs from A's and A keeps its own. A transaction pooler lends a
backend per transaction: B may be given the one A just gave back, or A, asked again while B
holds its transaction, is answered by another backend. Either is proof. Nothing is left
behind: B's transaction is rolled back, and nothing is set for a session.
"""

from __future__ import annotations

from typing import Protocol

import asyncpg

from ..shared.pooler import Pooler, connect


class Findings(Protocol):
    def ok(self, text: str) -> None: ...
    def problem(self, text: str) -> None: ...


async def transaction_pooled(dsn: str) -> tuple[int, int] | None:
    """Two distinct backend pids that answered one client, or one client and another, in a
    way only a transaction pooler does; ``None`` when each client kept its backend."""
    a = await connect(dsn, pooler="transaction")
    try:
        b = await connect(dsn, pooler="transaction")
        try:
            first: int = await a.fetchval("SELECT pg_backend_pid()")
            async with b.transaction():
                held: int = await b.fetchval("SELECT pg_backend_pid()")
                if held == first:  # B was lent the backend A had just given back
                    return first, held
                again: int = await a.fetchval("SELECT pg_backend_pid()")
            return (first, again) if again != first else None
        finally:
            await b.close()
    finally:
        await a.close()


async def check_pooler(dsn: str, declared: Pooler, report: Findings) -> None:
    """A problem when a transaction pooler answers but the deployment did not declare one
    (nothing when PostgreSQL does not answer: its own check says so)."""
    try:
        found = await transaction_pooled(dsn)
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return  # unreachable or malformed (a ValueError quoting it): the PostgreSQL check said
    if found is None:
        report.ok(f"each client keeps its PostgreSQL backend (postgres.pooler={declared})")
    elif declared == "transaction":
        report.ok("PostgreSQL is reached through a pooler in transaction mode, as declared "
                  "(postgres.pooler=transaction)")
    else:
        proof = (f"backend {found[0]} answered two clients' transactions in turn"
                 if found[0] == found[1] else
                 f"backends {found[0]} and {found[1]} answered one client's transactions")
        report.problem(
            f"PostgreSQL is reached through a pooler in transaction mode ({proof}), but "
            f"postgres.pooler is {declared}: set CONSUMERKIT_POSTGRES_POOLER=transaction "
            '(--postgres-pooler transaction, Postgres(pooler="transaction") in code) for the '
            "consumers, relays and this check")
