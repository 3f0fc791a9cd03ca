"""The effect every database peer applies, and the gate that checks it exactly.

The effect of one distinct event is one upsert of its key's running total. The row also counts
its upserts (``n``) and stamps the database clock of its first and last upsert, so that

- "done" is judged from the database: ``sum(n)`` reaches the number of distinct events;
- the measured window is the database's own first-effect to last-effect time;
- a duplicate effect shows as ``n`` above the key's event count and a total above expected, a
  lost one as the opposite. Either makes the peer WRONG (reported, never ranked).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from .workload import Workload

if TYPE_CHECKING:
    import asyncpg

    Connection: TypeAlias = asyncpg.Connection[asyncpg.Record]


def _q(schema: str) -> str:
    if not schema.replace("_", "").isalnum() or not schema.islower():
        raise ValueError(f"unsafe schema name {schema!r}")
    return f'"{schema}"'


def upsert_sql(schema: str) -> str:
    """The effect: ``$1`` key, ``$2`` amount."""
    return (
        f"INSERT INTO {_q(schema)}.totals AS t (key, total, n, first_at, last_at) "
        "VALUES ($1, $2, 1, clock_timestamp(), clock_timestamp()) "
        "ON CONFLICT (key) DO UPDATE SET total = t.total + EXCLUDED.total, n = t.n + 1, "
        "last_at = EXCLUDED.last_at")


def dedup_sql(schema: str) -> str:
    """The textbook dedup claim: ``$1`` event id; status ``INSERT 0 1`` when fresh."""
    return f"INSERT INTO {_q(schema)}.processed (event_id) VALUES ($1) ON CONFLICT DO NOTHING"


async def create_schema(conn: Connection, schema: str) -> None:
    """A fresh schema with the effect table and the textbook's plain dedup table."""
    s = _q(schema)
    await conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
    await conn.execute(f"CREATE SCHEMA {s}")
    await conn.execute(
        f"CREATE TABLE {s}.totals (key text PRIMARY KEY, total bigint NOT NULL, "
        "n integer NOT NULL, first_at timestamptz NOT NULL, last_at timestamptz NOT NULL)")
    await conn.execute(f"CREATE TABLE {s}.processed (event_id text PRIMARY KEY)")


async def drop_schema(conn: Connection, schema: str) -> None:
    await conn.execute(f"DROP SCHEMA IF EXISTS {_q(schema)} CASCADE")


async def effect_count(conn: Connection, schema: str) -> int:
    return int(await conn.fetchval(f"SELECT coalesce(sum(n), 0) FROM {_q(schema)}.totals"))


async def window(conn: Connection, schema: str) -> float:
    """Seconds from the first effect to the last, by the database clock."""
    value = await conn.fetchval(
        f"SELECT extract(epoch FROM max(last_at) - min(first_at)) FROM {_q(schema)}.totals")
    return float(value or 0.0)


@dataclass(frozen=True, slots=True)
class Verdict:
    exact: bool
    detail: str


async def check(conn: Connection, schema: str, workload: Workload) -> Verdict:
    """Per key: the total and the number of upserts equal the expected ones."""
    rows = await conn.fetch(f"SELECT key, total, n FROM {_q(schema)}.totals")
    got = {r["key"]: (int(r["total"]), int(r["n"])) for r in rows}
    extra = lost = wrong = 0
    for key, total in workload.totals.items():
        have_total, have_n = got.pop(key, (0, 0))
        want_n = workload.counts[key]
        extra += max(have_n - want_n, 0)
        lost += max(want_n - have_n, 0)
        wrong += have_total != total
    phantom = len(got)
    if extra or lost or wrong or phantom:
        return Verdict(False, f"{extra} duplicate effects, {lost} lost effects, {wrong} keys "
                              f"with a wrong total, {phantom} unexpected keys")
    return Verdict(True, f"{workload.distinct} effects exact over {len(workload.totals)} keys")


async def wait_done(conn: Connection, schema: str, workload: Workload, handled: Callable[[], int],
                    deadline: float, poll: float = 0.05, settle: float = 1.0) -> bool:
    """Wait until the database holds every distinct event's effect and the peer has handled
    every message (so a late duplicate effect cannot slip past the check). False when the
    deadline (``time.monotonic()``) passes, or when the peer handled everything yet the
    effects stay short for ``settle`` seconds (lost effects)."""
    short_since: float | None = None
    while True:
        count = await effect_count(conn, schema)
        everything = handled() >= workload.size
        if count >= workload.distinct and everything:
            return True
        now = time.monotonic()
        if everything:
            short_since = short_since if short_since is not None else now
            if now - short_since > settle:
                return False
        if now > deadline:
            return False
        await asyncio.sleep(poll)

