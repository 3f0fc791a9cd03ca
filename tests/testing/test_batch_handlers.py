"""The test kit runs batch handlers and deferred writes as the consumer does; and a property:
with per-record and batch handlers mixed on the same keys, deferred and awaited writes, random
handler latencies and several lanes at once, each event's effect happens once, and each key's
effects in the order its events were published."""

from __future__ import annotations

import asyncio

import asyncpg
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import examples.batch_handlers as example
from consumerkit import (
    BatchContext,
    HandlerContext,
    HandlerRegistry,
    Limits,
    Outbox,
    Postgres,
    RetryPolicy,
)
from consumerkit.testing import TestConsumer

TABLE = ("CREATE TABLE effects (id bigserial PRIMARY KEY, key text NOT NULL, "
         "seq int NOT NULL, via text NOT NULL)")
INSERT = "INSERT INTO effects (key, seq, via) VALUES ($1, $2, $3)"


class Step(BaseModel):
    key: str
    seq: int
    pause_ms: int = 0  # how long the handler takes (an awaited call elsewhere)
    fail: bool = False


registry = HandlerRegistry()
CALLS: list[int] = []  # the number of events of each batch call


@registry.handler("step.batched", batch=True)
async def apply_steps(events: list[Step], ctx: BatchContext) -> None:
    CALLS.append(len(events))
    await asyncio.sleep(max(e.pause_ms for e in events) / 1000)
    if any(e.fail for e in events):
        raise ValueError("a step of this call failed")
    for event in events:
        ctx.defer(INSERT, event.key, event.seq, "batch")


@registry.handler("step.deferred")
async def defer_step(event: Step, ctx: HandlerContext) -> None:
    await asyncio.sleep(event.pause_ms / 1000)
    ctx.defer(INSERT, event.key, event.seq, "deferred")


@registry.handler("step.awaited")
async def await_step(event: Step, ctx: HandlerContext) -> None:
    await asyncio.sleep(event.pause_ms / 1000)
    await ctx.tx.execute(INSERT, event.key, event.seq, "awaited")


async def effects(dsn: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetch("SELECT key, seq, via FROM effects ORDER BY id")
    finally:
        await conn.close()


async def fresh_table(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DROP TABLE IF EXISTS effects")
        await conn.execute(TABLE)
    finally:
        await conn.close()


async def test_the_kit_runs_batch_handlers_and_reports_each_event(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    await fresh_table(consumerkit_dsn)
    CALLS.clear()
    async with TestConsumer([registry],
                            postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                            limits=Limits(max_batch=50)) as kit:
        for seq in range(6):
            kit.publish(Step(key=f"k{seq % 2}", seq=seq), key=f"k{seq % 2}",
                        event_type="step.batched")
        failing = kit.publish(Step(key="bad", seq=0, fail=True), key="bad",
                              event_type="step.batched")
        await kit.drain(fail_fast=False)
    assert len(kit.applied) == 6
    [entry] = kit.dead_letters
    assert entry.event_id == (dict(failing.headers or ())["id"] or b"").decode()
    assert entry.attempts == 3  # alone, as many attempts as the retry policy gives
    rows = await effects(consumerkit_dsn)
    assert sorted((r["key"], r["seq"]) for r in rows) == [
        (f"k{seq % 2}", seq) for seq in sorted(range(6), key=lambda s: (s % 2, s))]


# (key, handler, pause in ms)
EVENTS = st.lists(st.tuples(st.sampled_from("abcd"),
                            st.sampled_from(["step.batched", "step.deferred", "step.awaited"]),
                            st.integers(0, 3)), min_size=1, max_size=30)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=EVENTS, max_batch=st.sampled_from([1, 3, 500]),
       redeliver=st.lists(st.integers(0, 1000), max_size=5))
async def test_each_effect_once_in_key_order_with_mixed_handlers_and_latencies(
    consumerkit_dsn: str, consumerkit_schema: str, events: list[tuple[str, str, int]],
    max_batch: int, redeliver: list[int],
) -> None:
    await fresh_table(consumerkit_dsn)
    # event ids are new in every example: the dedup rows of earlier ones change nothing
    async with TestConsumer([registry],
                            postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                            limits=Limits(max_batch=max_batch, concurrency=3),
                            partitions=2,
                            retry=RetryPolicy(max_attempts=1)) as kit:
        seqs = dict.fromkeys("abcd", 0)
        published = []
        for key, event_type, pause in events:
            published.append(kit.publish(Step(key=key, seq=seqs[key], pause_ms=pause),
                                         key=key, event_type=event_type))
            seqs[key] += 1
        for index in redeliver:
            kit.redeliver(published[index % len(published)])
        await kit.drain()
    rows = await effects(consumerkit_dsn)
    for key, count in seqs.items():
        assert [r["seq"] for r in rows if r["key"] == key] == list(range(count)), key
    assert len(rows) == len(published) == len(kit.applied)
    via = {"step.batched": "batch", "step.deferred": "deferred", "step.awaited": "awaited"}
    per_key = {key: [via[t] for k, t, _ in events if k == key] for key in "abcd"}
    for key, expected in per_key.items():
        assert [r["via"] for r in rows if r["key"] == key] == expected


async def test_the_batch_handlers_example_runs_as_the_docs_say(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    """examples/batch_handlers.py (quoted by docs/handlers.md) against real tables."""
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute("CREATE TABLE stock (sku text PRIMARY KEY, quantity int NOT NULL)")
        await conn.execute("CREATE TABLE orders (order_id text PRIMARY KEY, lines int NOT NULL)")
        await conn.execute("CREATE TABLE order_lines (order_id text, sku text, quantity int)")
        await conn.execute("INSERT INTO orders VALUES ('o-1', 0)")
        async with TestConsumer([example.handlers],
                                postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                                limits=Limits(max_batch=100),
                                outbox=Outbox(consumerkit_schema)) as kit:
            for sku, quantity in (("s-1", 5), ("s-2", 7), ("s-1", 3)):
                kit.publish(example.StockCounted(sku=sku, quantity=quantity), key=sku,
                            event_type="stock.counted")
            for sku in ("s-1", "s-2", "s-3"):
                kit.publish(example.LineAdded(order_id="o-1", sku=sku, quantity=1), key="o-1",
                            event_type="line.added")
            kit.publish(example.LineRemoved(order_id="o-1", sku="s-2"), key="o-1",
                        event_type="line.removed")
            shipped = kit.publish(example.OrderShipped(order_id="o-1", items=2), key="o-1",
                                  event_type="order.shipped")
            await kit.drain()
        stock = await conn.fetch("SELECT sku, quantity FROM stock ORDER BY sku")
        assert [(r["sku"], r["quantity"]) for r in stock] == [("s-1", 3), ("s-2", 7)]
        lines = await conn.fetch("SELECT sku FROM order_lines ORDER BY sku")
        assert [r["sku"] for r in lines] == ["s-1", "s-3"]
        assert await conn.fetchval("SELECT lines FROM orders WHERE order_id = 'o-1'") == 2
        [announced] = await conn.fetch("SELECT type, headers FROM outbox")
        cause = (dict(shipped.headers or ())["id"] or b"").decode()
        assert announced["type"] == "shipment.announced"
        assert orjson.loads(announced["headers"])["causation_id"] == cause
    finally:
        await conn.close()
