"""Dead letters replayed and discarded behind a real PgBouncer in transaction mode: every entry
applied once in per-key order, and no advisory lock left on a backend other clients share
(the replay's lock is held by a transaction, never by a session)."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg

from consumerkit import (
    Consumer,
    DeadLetterFilter,
    Postgres,
    discard_dead_letters,
    replay_dead_letters,
)

from ..deadletters.conftest import APP, bury, letters, statuses
from ..integration.ledger import ledger_handler, ledger_rows, verify
from .conftest import PgBouncer


async def test_replay_and_discard_through_the_pooler_leave_no_lock_behind(
    pgbouncer: Callable[..., PgBouncer], pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    bouncer = pgbouncer(pool_size=3)
    buried = letters(keys=8, per_key=25)
    await bury(pg_pool, pg_schema, buried)
    app = Consumer(name=APP, handlers=[ledger_handler(pg_schema)], topics=["steps"],
                   postgres=Postgres(dsn=bouncer.dsn, pooler="transaction", schema=pg_schema),
                   handle_signals=False)
    report = await replay_dead_letters(app, DeadLetterFilter(partition=0, limit=100),
                                       note="through the pooler")
    assert (report.chosen, report.replayed, report.failed) == (50, 50, 0)
    assert await pg_pool.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    conn = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
    try:
        dropped = await discard_dead_letters(conn, pg_schema, DeadLetterFilter(partition=1))
    finally:
        await conn.close()
    assert len(dropped) == 50
    rest = await replay_dead_letters(app)
    assert rest.replayed == 100
    assert await pg_pool.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    async with pg_pool.acquire() as c:
        verify(await ledger_rows(c, pg_schema), [b.event for b in buried if b.partition != 1])
    assert await statuses(pg_pool, pg_schema) == {"replayed": 150, "discarded": 50}
