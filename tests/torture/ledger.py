"""The torture workload's tables and handler, made to catch bugs rather than prevent them.

- ``business``: what producers committed (one row per event, written with its outbox row in
  one transaction), so a rolled-back event leaves no trace here.
- ``effects``: one row per applied effect, with NO unique constraint: a dedup bug shows up as
  a countable duplicate instead of an error that would hide it.
- ``projection``: the last sequence applied per aggregate; the handler checks seq = last + 1
  and records a violation (counted, never raised: raising would retry and hide it).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

from pydantic import BaseModel

from consumerkit import BatchContext, HandlerContext, handler
from consumerkit.shared.identifiers import identifier
from consumerkit.types import DbConnection

from .check import History, Produced

EVENT_TYPE = "step.recorded"


class Step(BaseModel):
    aggregate: str
    seq: int
    poison: bool = False


class PoisonError(ValueError):
    """What a poison event does to its handler, every time."""


def ddl(schema: str) -> list[str]:
    s = identifier(schema)
    return [
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"""CREATE TABLE {s}.business (event_id text PRIMARY KEY, aggregate text NOT NULL,
            seq int NOT NULL, poison bool NOT NULL DEFAULT false,
            created_at timestamptz NOT NULL DEFAULT clock_timestamp())""",
        f"CREATE TABLE {s}.counters (aggregate text PRIMARY KEY, n int NOT NULL DEFAULT 0)",
        f"""CREATE TABLE {s}.effects (id bigserial PRIMARY KEY, event_id text NOT NULL,
            aggregate text NOT NULL, seq int NOT NULL, consumer text NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT clock_timestamp())""",
        f"CREATE INDEX ON {s}.effects (event_id)",  # not unique: duplicates must show
        f"CREATE TABLE {s}.projection (aggregate text PRIMARY KEY, last_seq int NOT NULL)",
        f"""CREATE TABLE {s}.violations (event_id text NOT NULL, aggregate text NOT NULL,
            expected int NOT NULL, got int NOT NULL)""",
        # what the transactional producers sent (txn_producer_proc.py), and its outcome
        f"""CREATE TABLE {s}.txn_events (event_id text PRIMARY KEY, aggregate text NOT NULL,
            seq int NOT NULL, outcome text NOT NULL)""",
    ]


async def create(conn: DbConnection, schema: str, aggregates: int) -> None:
    for statement in ddl(schema):
        await conn.execute(statement)
    s = identifier(schema)
    for table in ("counters", "projection"):
        column = "n" if table == "counters" else "last_seq"
        await conn.execute(
            f"INSERT INTO {s}.{table} (aggregate, {column}) "
            f"SELECT 'agg-' || i, 0 FROM generate_series(0, {aggregates - 1}) i")


def _statements(schema: str) -> tuple[str, str, str, str]:
    """(this process's name, read the projection, apply an effect, record a violation)."""
    s = identifier(schema)
    return (
        os.environ.get("TORTURE_PROCESS", str(os.getpid())),
        f"SELECT last_seq FROM {s}.projection WHERE aggregate = $1 FOR UPDATE",
        f"""WITH u AS (UPDATE {s}.projection SET last_seq = $3 WHERE aggregate = $2)
        INSERT INTO {s}.effects (event_id, aggregate, seq, consumer) VALUES ($1, $2, $3, $4)""",
        f"INSERT INTO {s}.violations VALUES ($1, $2, $3, $4)",
    )


def make_handler(schema: str) -> Callable[[Step, HandlerContext], Awaitable[None]]:
    me, read, apply, wrong = _statements(schema)

    @handler(EVENT_TYPE)
    async def record_step(event: Step, ctx: HandlerContext) -> None:
        if event.poison:
            raise PoisonError(f"poison event {ctx.envelope.event_id}")
        last = await ctx.tx.fetchval(read, event.aggregate)
        if event.seq != last + 1:
            await ctx.tx.execute(wrong, ctx.envelope.event_id, event.aggregate, last + 1,
                                 event.seq)
        await ctx.tx.execute(apply, ctx.envelope.event_id, event.aggregate, event.seq, me)

    return record_step


def make_batch_handler(schema: str) -> Callable[[list[Step], BatchContext], Awaitable[None]]:
    """The same effects from a batch handler: the projection read through ``ctx.tx`` (which
    first sends what was deferred), every write deferred."""
    me, read, apply, wrong = _statements(schema)

    @handler(EVENT_TYPE, batch=True)
    async def record_steps(events: list[Step], ctx: BatchContext) -> None:
        for event, envelope in zip(events, ctx.envelopes, strict=True):
            if event.poison:
                raise PoisonError(f"poison event {envelope.event_id}")
            last = await ctx.tx.fetchval(read, event.aggregate)
            if event.seq != last + 1:
                ctx.defer(wrong, envelope.event_id, event.aggregate, last + 1, event.seq)
            ctx.defer(apply, envelope.event_id, event.aggregate, event.seq, me)

    return record_steps


async def read_history(conn: DbConnection, schema: str) -> History:
    """The database's side of the history (the topic's side is added by the caller)."""
    s = identifier(schema)
    committed = {r[0]: Produced(r[1], r[2], r[3]) for r in await conn.fetch(
        f"SELECT event_id, aggregate, seq, poison FROM {s}.business")}
    effects = [(r[0], r[1], r[2]) for r in await conn.fetch(
        f"SELECT event_id, aggregate, seq FROM {s}.effects ORDER BY id")]
    letters = [(r[0], r[1]) for r in await conn.fetch(
        f"SELECT event_id, reason FROM {s}.dead_letters")]
    violations = [(r[0], r[1]) for r in await conn.fetch(
        f"SELECT aggregate, got FROM {s}.violations")]
    return History(committed=committed, effects=effects, dead_letters=letters, published=[],
                   projection_violations=len(violations), violations=violations)


async def latency_ms(conn: DbConnection, schema: str) -> tuple[float, float]:
    """p50 and p99, in ms, from an event's business write to its first effect."""
    s = identifier(schema)
    row = await conn.fetchrow(f"""
        SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms),
               percentile_cont(0.99) WITHIN GROUP (ORDER BY ms)
        FROM (SELECT extract(epoch FROM min(e.applied_at) - b.created_at) * 1000 AS ms
              FROM {s}.effects e JOIN {s}.business b USING (event_id)
              GROUP BY e.event_id, b.created_at) t""")
    assert row is not None
    return float(row[0] or 0.0), float(row[1] or 0.0)


async def progress(conn: DbConnection, schema: str) -> tuple[int, int, int]:
    """(events not yet settled, outbox rows waiting, effects so far): drained at (0, 0, _).
    An event is settled once it has an effect or a dead letter."""
    s = identifier(schema)
    row = await conn.fetchrow(f"""
        SELECT (SELECT count(*) FROM {s}.business b WHERE NOT EXISTS
                  (SELECT 1 FROM {s}.effects e WHERE e.event_id = b.event_id)
                AND NOT EXISTS (SELECT 1 FROM {s}.dead_letters d
                                WHERE d.event_id = b.event_id)),
               (SELECT count(*) FROM {s}.outbox),
               (SELECT count(*) FROM {s}.effects)""")
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


async def read_txn_events(conn: DbConnection, schema: str) -> dict[str, tuple[str, int, str]]:
    """event id -> (aggregate, seq, outcome) of every record a transactional producer sent:
    ``committed`` (also in ``business``), ``aborted``, ``unknown`` or ``open`` (the commit's
    outcome was not known, or never recorded)."""
    s = identifier(schema)
    return {r[0]: (r[1], r[2], r[3]) for r in await conn.fetch(
        f"SELECT event_id, aggregate, seq, outcome FROM {s}.txn_events")}
