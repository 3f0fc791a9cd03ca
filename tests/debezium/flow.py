"""The consumer side of the Debezium tests: handlers that record each applied event in the
handler's transaction (no unique key, so a duplicate effect would show as a second row) and
optionally emit a follow-up event with ``ctx.publish``; and the checks on what they applied."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from pydantic import BaseModel

from consumerkit import Consumer, HandlerContext, Kafka, Postgres, handler
from consumerkit.outbox import Outbox

STEP = "step.done"
ECHO = "step.echoed"
TRACE = "00-{:032x}-b7ad6b7169203331-01"


class Step(BaseModel):
    key: str
    n: int


@dataclass(frozen=True)
class Written:
    event_id: str
    key: str
    n: int
    traceparent: str


async def write_steps(dsn: str, outbox: Outbox, aggregate_type: str, keys: Sequence[str],
                      start: int, count: int) -> list[Written]:
    """``count`` events per key, numbered from ``start``, one transaction each, each with a
    traceparent of its own."""
    written = []
    conn = await asyncpg.connect(dsn)
    try:
        for n in range(start, start + count):
            for key in keys:
                trace = TRACE.format(uuid.uuid4().int)
                async with conn.transaction():
                    added = await outbox.add(
                        conn, event_type=STEP, aggregate_type=aggregate_type,
                        aggregate_id=key, payload=Step(key=key, n=n),
                        headers={"traceparent": trace})
                written.append(Written(str(added), key, n, trace))
    finally:
        await conn.close()
    return written


def applied_sql(schema: str) -> str:
    return f"""CREATE TABLE IF NOT EXISTS {schema}.applied (
        seq bigserial PRIMARY KEY, event_id text NOT NULL, event_type text NOT NULL,
        key text NOT NULL, n integer NOT NULL, traceparent text, occurred_at timestamptz,
        causation_id text)"""


def handlers(schema: str, echo_to: str | None) -> list[Callable[..., Any]]:
    """A handler of STEP (emitting an ECHO to aggregate type ``echo_to`` when given) and one
    of ECHO, both recording what they applied."""
    async def record(ctx: HandlerContext, event: Step) -> None:
        env = ctx.envelope
        await ctx.tx.execute(
            f"INSERT INTO {schema}.applied (event_id, event_type, key, n, traceparent, "
            "occurred_at, causation_id) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            env.event_id, env.event_type, event.key, event.n, env.traceparent,
            env.occurred_at, env.causation_id)

    @handler(STEP)
    async def on_step(event: Step, ctx: HandlerContext) -> None:
        await record(ctx, event)
        if echo_to is not None:
            await ctx.publish(event_type=ECHO, aggregate_type=echo_to, aggregate_id=event.key,
                              payload=event)

    @handler(ECHO)
    async def on_echo(event: Step, ctx: HandlerContext) -> None:
        await record(ctx, event)

    return [on_step, on_echo]


@contextlib.asynccontextmanager
async def consuming(dsn: str, bootstrap: str, schema: str, topics: list[str],
                    echo_to: str | None = None, name: str | None = None,
                    outbox: Outbox | None = None) -> AsyncIterator[Consumer]:
    """A consumer running in a task; ``name`` (its group and dedup namespace) is fresh unless
    given: give the same one to stand for the same consumer restarted. ``ctx.publish`` writes
    to ``outbox`` (default: the schema's plain ``outbox``)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(applied_sql(schema))
    finally:
        await conn.close()
    consumer = Consumer(
        name=name or f"cdc-{uuid.uuid4().hex[:8]}", handlers=handlers(schema, echo_to),
        topics=topics,
        postgres=Postgres(dsn=dsn, schema=schema),
        kafka=Kafka(bootstrap=bootstrap),
        outbox=outbox or Outbox(schema, "outbox", notify=False), handle_signals=False)
    task = asyncio.create_task(consumer.run())
    try:
        yield consumer
    finally:
        await consumer.stop()
        async with asyncio.timeout(60):
            await task


async def applied(dsn: str, schema: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(f"SELECT * FROM {schema}.applied ORDER BY seq"))
    finally:
        await conn.close()


async def wait_applied(dsn: str, schema: str, count: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    found = 0
    while time.monotonic() < deadline:
        found = len(await applied(dsn, schema))
        if found >= count:
            return
        await asyncio.sleep(0.3)
    raise AssertionError(f"{found} of {count} events applied within {timeout}s")


def check_once_in_order(rows: Sequence[asyncpg.Record], written: Sequence[Written],
                        event_type: str = STEP) -> None:
    """Each written event applied exactly once, per key in the order written, with its id
    and traceparent."""
    mine = [r for r in rows if r["event_type"] == event_type]
    ids = [r["event_id"] for r in mine]
    assert sorted(ids) == sorted(w.event_id for w in written), "lost or duplicated effects"
    per_key: dict[str, list[int]] = defaultdict(list)
    for r in mine:
        per_key[r["key"]].append(r["n"])
    for key, ns in per_key.items():
        assert ns == sorted(ns), f"aggregate {key} applied out of order: {ns}"
    traces = {w.event_id: w.traceparent for w in written}
    assert all(r["traceparent"] == traces[r["event_id"]] for r in mine)
