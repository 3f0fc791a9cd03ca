"""The effect each distinct event must have exactly once, at three handler costs.

``upsert`` (the default): one upsert of the key's running total. The row also counts its
upserts (``n``) and stamps the database clock of its first and last upsert, so that

- "done" is judged from the database: ``sum(n)`` reaches the number of distinct events;
- the measured window ends at the last effect, by the database's clock (``max(last_at)``);
- a duplicate effect shows as ``n`` above the key's event count and a total above expected, a
  lost one as the opposite. Either makes the peer WRONG (reported, never ranked).

``io``: a 5 ms awaited call (``asyncio.sleep``, standing in for an HTTP or RPC call) before
the same upsert. A batch applies its calls concurrently, so a batch waits 5 ms once.

``none``: no database work at all; the effect is a per-key tally in the process, stamped with
``time.time()``. It is checked the same way (counts and totals per key), from memory.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from consumerkit.types import DbConnection as Connection

from .workload import Workload

Cost = Literal["none", "upsert", "io"]
IO_DELAY = 0.005


def q(schema: str) -> str:
    """``schema`` quoted, after checking it is a safe lower-case identifier."""
    if not schema.replace("_", "").isalnum() or not schema.islower():
        raise ValueError(f"unsafe schema name {schema!r}")
    return f'"{schema}"'


def upsert_sql(schema: str) -> str:
    """The effect: ``$1`` key, ``$2`` amount."""
    return (
        f"INSERT INTO {q(schema)}.totals AS t (key, total, n, first_at, last_at) "
        "VALUES ($1, $2, 1, clock_timestamp(), clock_timestamp()) "
        "ON CONFLICT (key) DO UPDATE SET total = t.total + EXCLUDED.total, n = t.n + 1, "
        "last_at = EXCLUDED.last_at")


def upsert_many_sql(schema: str) -> str:
    """The effects of a batch in one statement: ``$1`` keys, ``$2`` amounts."""
    return (
        f"INSERT INTO {q(schema)}.totals AS t (key, total, n, first_at, last_at) "
        "SELECT key, sum(amount), count(*), clock_timestamp(), clock_timestamp() "
        "FROM unnest($1::text[], $2::bigint[]) AS u(key, amount) GROUP BY key "
        "ON CONFLICT (key) DO UPDATE SET total = t.total + EXCLUDED.total, "
        "n = t.n + EXCLUDED.n, last_at = EXCLUDED.last_at")


def dedup_sql(schema: str) -> str:
    """The textbook dedup claim: ``$1`` event id; status ``INSERT 0 1`` when fresh."""
    return f"INSERT INTO {q(schema)}.processed (event_id) VALUES ($1) ON CONFLICT DO NOTHING"


def dedup_many_sql(schema: str) -> str:
    """The set-based claim of a batch: ``$1`` event ids; returns the fresh ones."""
    return (f"INSERT INTO {q(schema)}.processed (event_id) SELECT unnest($1::text[]) "
            "ON CONFLICT DO NOTHING RETURNING event_id")


async def create_schema(conn: Connection, schema: str) -> None:
    """A fresh schema with the effect table and the textbook's plain dedup table."""
    s = q(schema)
    await conn.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
    await conn.execute(f"CREATE SCHEMA {s}")
    await conn.execute(
        f"CREATE TABLE {s}.totals (key text PRIMARY KEY, total bigint NOT NULL, "
        "n integer NOT NULL, first_at timestamptz NOT NULL, last_at timestamptz NOT NULL)")
    await conn.execute(f"CREATE TABLE {s}.processed (event_id text PRIMARY KEY)")


async def drop_schema(conn: Connection, schema: str) -> None:
    await conn.execute(f"DROP SCHEMA IF EXISTS {q(schema)} CASCADE")


@dataclass(frozen=True, slots=True)
class Verdict:
    exact: bool
    detail: str


def judge(got: dict[str, tuple[int, int]], workload: Workload) -> Verdict:
    """Per key: the total and the number of effects equal the expected ones."""
    got = dict(got)
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


class Effect(ABC):
    """What a peer does for a fresh event, and how the run reads back what was done."""

    cost: Cost

    @abstractmethod
    async def apply(self, conn: Connection, key: str, amount: int) -> None: ...

    @abstractmethod
    async def apply_many(self, conn: Connection, items: Sequence[tuple[str, int]]) -> None: ...

    @abstractmethod
    async def count(self, conn: Connection) -> int:
        """Effects applied so far."""

    @abstractmethod
    async def state(self, conn: Connection) -> dict[str, tuple[int, int]]:
        """Per key: (total, number of effects)."""

    @abstractmethod
    async def last_at(self, conn: Connection) -> float:
        """When the last effect was applied (seconds since the epoch; 0 if none was)."""

    @abstractmethod
    async def first_at(self, conn: Connection) -> dict[str, float]:
        """Per key: the time of its first effect (seconds since the epoch)."""

    async def check(self, conn: Connection, workload: Workload) -> Verdict:
        return judge(await self.state(conn), workload)


class DbEffect(Effect):
    """The upsert (``cost="upsert"``), optionally after a 5 ms awaited call (``"io"``)."""

    def __init__(self, schema: str, cost: Cost = "upsert") -> None:
        self.schema, self.cost = schema, cost
        self.delay = IO_DELAY if cost == "io" else 0.0
        self.sql, self.many_sql = upsert_sql(schema), upsert_many_sql(schema)

    async def apply(self, conn: Connection, key: str, amount: int) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        await conn.execute(self.sql, key, amount)

    async def apply_many(self, conn: Connection, items: Sequence[tuple[str, int]]) -> None:
        if not items:
            return
        if self.delay:
            await asyncio.sleep(self.delay)
        await conn.execute(self.many_sql, [k for k, _ in items], [a for _, a in items])

    async def count(self, conn: Connection) -> int:
        return int(await conn.fetchval(f"SELECT coalesce(sum(n), 0) FROM {q(self.schema)}.totals"))

    async def state(self, conn: Connection) -> dict[str, tuple[int, int]]:
        rows = await conn.fetch(f"SELECT key, total, n FROM {q(self.schema)}.totals")
        return {r["key"]: (int(r["total"]), int(r["n"])) for r in rows}

    async def last_at(self, conn: Connection) -> float:
        value = await conn.fetchval(
            f"SELECT extract(epoch FROM max(last_at)) FROM {q(self.schema)}.totals")
        return float(value or 0.0)

    async def first_at(self, conn: Connection) -> dict[str, float]:
        rows = await conn.fetch(
            f"SELECT key, extract(epoch FROM first_at) AS at FROM {q(self.schema)}.totals")
        return {r["key"]: float(r["at"]) for r in rows}


class MemoryEffect(Effect):
    """``cost="none"``: a tally per key in this process, no database work."""

    cost: Cost = "none"

    def __init__(self) -> None:
        self.totals: Counter[str] = Counter()
        self.counts: Counter[str] = Counter()
        self.first: dict[str, float] = {}
        self.last = 0.0

    def _add(self, key: str, amount: int) -> None:
        now = time.time()
        self.totals[key] += amount
        self.counts[key] += 1
        self.first.setdefault(key, now)
        self.last = now

    async def apply(self, conn: Connection, key: str, amount: int) -> None:
        self._add(key, amount)

    async def apply_many(self, conn: Connection, items: Sequence[tuple[str, int]]) -> None:
        for key, amount in items:
            self._add(key, amount)

    async def count(self, conn: Connection) -> int:
        return sum(self.counts.values())

    async def state(self, conn: Connection) -> dict[str, tuple[int, int]]:
        return {k: (self.totals[k], n) for k, n in self.counts.items()}

    async def last_at(self, conn: Connection) -> float:
        return self.last

    async def first_at(self, conn: Connection) -> dict[str, float]:
        return dict(self.first)


def make_effect(schema: str, cost: Cost) -> Effect:
    return MemoryEffect() if cost == "none" else DbEffect(schema, cost)


async def wait_done(conn: Connection, effect: Effect, workload: Workload,
                    handled: Callable[[], int], deadline: float, poll: float = 0.05,
                    settle: float = 1.0) -> bool:
    """Wait until every distinct event's effect is there and the peer has handled every
    message (so a late duplicate effect cannot slip past the check). False when the deadline
    (``time.monotonic()``) passes, or when the peer handled everything yet the effects stay
    short for ``settle`` seconds (lost effects)."""
    short_since: float | None = None
    while True:
        count = await effect.count(conn)
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
