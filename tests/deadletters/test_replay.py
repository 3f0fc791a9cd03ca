"""Replaying dead letters through the API: thousands applied once, in per-key order; a key
that still fails keeps its entries waiting, with why, and holds back its later ones."""

from __future__ import annotations

import json
import time
from typing import Any

import asyncpg
import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel

import consumerkit.schema as schema_module
from consumerkit import (
    Consumer,
    DeadLetterEntry,
    DeadLetterError,
    DeadLetterFilter,
    DeadLetterTable,
    HandlerContext,
    HandlerRegistry,
    Outbox,
    Postgres,
    RetryPolicy,
    discard_dead_letters,
    handler,
    migrate,
    replay_dead_letters,
    upcaster,
)
from consumerkit.deadletter.table import TABLE
from consumerkit.outbox import OutboxTable
from consumerkit.schema import CORE_STEPS
from consumerkit.shared.identifiers import qualified
from consumerkit.types import SinkResources

from ..integration.ledger import Step, ledger_handler, ledger_rows, verify
from .conftest import APP, bury, letters, statuses


class Broken:
    """Fails every event of ``key`` from ``seq`` on, until ``key`` is set to None."""

    def __init__(self, key: str | None, seq: int) -> None:
        self.key, self.seq = key, seq

    async def __call__(self, event: Step, ctx: HandlerContext) -> None:
        if event.key == self.key and event.seq >= self.seq:
            raise ValueError(f"{event.key} still cannot be applied")


def consumer(dsn: str, schema: str, broken: Broken, registry: CollectorRegistry) -> Consumer:
    return Consumer(name=APP, handlers=[ledger_handler(schema, broken)], topics=["steps"],
                    postgres=Postgres(dsn=dsn, schema=schema),
                    handle_signals=False, registry=registry,
                    retry=RetryPolicy(max_attempts=2, initial_delay=0.01, max_delay=0.02))


async def test_4000_dead_letters_of_40_keys_are_applied_once_in_per_key_order(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    buried = letters(keys=40, per_key=100)
    await bury(pg_pool, pg_schema, buried)
    broken = Broken("key-7", seq=60)  # the fix missed one case: key-7 fails from its 60th
    registry = CollectorRegistry()
    app = consumer(postgres_dsn, pg_schema, broken, registry)
    started = time.monotonic()
    first = await replay_dead_letters(app, note="fix 1234 deployed")
    took = time.monotonic() - started
    assert (first.chosen, first.replayed, first.failed, first.held_back) == (4000, 3959, 1, 40)
    assert first.failures[0].endswith("(event evt-7-60): handler_failed: after 2 attempts: "
                                      "ValueError: key-7 still cannot be applied")
    failed = await pg_pool.fetchrow(
        f"SELECT status, reason, replay_attempts, last_replay_error "
        f"FROM {qualified(pg_schema, TABLE)} WHERE event_id = 'evt-7-60'")
    assert failed is not None
    assert (failed["status"], failed["reason"], failed["replay_attempts"]) == (
        "waiting", "handler_failed", 1)  # the entry as it was, the new reason beside it
    assert "key-7 still cannot be applied" in failed["last_replay_error"]
    assert await statuses(pg_pool, pg_schema) == {"replayed": 3959, "waiting": 41}
    broken.key = None
    second = await replay_dead_letters(app, note="fix 1235 deployed")
    assert (second.chosen, second.replayed, second.failed) == (41, 41, 0)
    async with pg_pool.acquire() as conn:
        rows = await ledger_rows(conn, pg_schema)
    verify(rows, [b.event for b in buried])  # each once, each key in its order
    again = await replay_dead_letters(app)
    assert (again.chosen, again.replayed) == (0, 0)
    audit = await pg_pool.fetch(
        f"SELECT DISTINCT status, resolved_by = current_user AS by_role, resolution_note "
        f"FROM {qualified(pg_schema, TABLE)} WHERE resolved_at IS NOT NULL")
    assert {(a["status"], a["by_role"], a["resolution_note"]) for a in audit} == {
        ("replayed", True, "fix 1234 deployed"), ("replayed", True, "fix 1235 deployed")}
    assert app.stats.dead_letters_replayed == 4000
    assert app.stats.dead_letter_replays_failed == 1
    labels = {"consumer": APP, "topic": "steps"}
    assert registry.get_sample_value("consumerkit_dead_letters_resolved_total",
                                     {**labels, "outcome": "replayed"}) == 4000
    assert registry.get_sample_value("consumerkit_dead_letters_resolved_total",
                                     {**labels, "outcome": "replay_failed"}) == 1
    assert took < 120, f"the first replay took {took:.1f}s"


async def test_a_filter_takes_only_its_entries_and_discard_keeps_them_marked(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    buried = letters(keys=4, per_key=3)
    await bury(pg_pool, pg_schema, buried)
    app = consumer(postgres_dsn, pg_schema, Broken(None, 0), CollectorRegistry())
    behind = await replay_dead_letters(app, DeadLetterFilter(ids=(10,)))  # evt-1-3
    assert (behind.chosen, behind.replayed, behind.held_back) == (1, 0, 1)
    assert behind.failures[0].endswith("held back: an earlier entry of its key waits and was "
                                       "not chosen (replay it first, or discard it)")
    report = await replay_dead_letters(app, DeadLetterFilter(partition=1, limit=2))
    assert (report.chosen, report.replayed) == (2, 2)
    async with pg_pool.acquire() as conn:
        assert [r["event_id"] for r in await ledger_rows(conn, pg_schema)] == [
            "evt-1-1", "evt-1-2"]
        ids = await discard_dead_letters(conn, pg_schema, DeadLetterFilter(topic="steps",
                                                                           partition=0),
                                         note="duplicates of a bad import")
    assert len(ids) == 3
    rows = await pg_pool.fetch(
        f"SELECT status, resolved_by = current_user AS by_role, resolution_note "
        f"FROM {qualified(pg_schema, TABLE)} WHERE id = ANY($1::bigint[])", ids)
    assert {(r["status"], r["by_role"], r["resolution_note"]) for r in rows} == {
        ("discarded", True, "duplicates of a bad import")}
    assert await statuses(pg_pool, pg_schema) == {"replayed": 2, "discarded": 3,
                                                  "waiting": 7}


async def test_dead_letters_of_an_older_schema_are_waiting_after_the_upgrade(
    pg_schema: str, pg_pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schema_module, "CORE_STEPS", CORE_STEPS[:8])  # as before step 9
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        await conn.execute(
            f'INSERT INTO {qualified(pg_schema, TABLE)} (consumer, topic, "partition", '
            "\"offset\", reason, detail, failed_at) VALUES ('a', 't', 0, 1, 'r', 'd', now())")
    monkeypatch.undo()
    async with pg_pool.acquire() as conn:
        await migrate(conn, pg_schema)
        row = await conn.fetchrow(
            f"SELECT status, replay_attempts, resolved_at FROM {qualified(pg_schema, TABLE)}")
    assert row is not None
    assert (row["status"], row["replay_attempts"], row["resolved_at"]) == ("waiting", 0, None)


class Order(BaseModel):
    order_id: str
    total_cents: int


@handler("order.created", version=2)
async def accept_order(event: Order, ctx: HandlerContext) -> None:
    await ctx.publish(event_type="order.accepted", aggregate_type="order",
                      aggregate_id=event.order_id, payload={"total_cents": event.total_cents})


@upcaster("order.created", from_version=1)
def rename_amount(doc: dict[str, Any]) -> dict[str, Any]:
    doc["total_cents"] = doc.pop("amount")
    return doc


async def test_a_replay_goes_through_the_upcasters_and_the_outbox_once(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    await bury(pg_pool, pg_schema, [])
    async with pg_pool.acquire() as conn:
        await migrate(conn, dedup=None, outboxes=[OutboxTable(pg_schema, "outbox")])
    sink = DeadLetterTable()
    await sink.open(SinkResources(pg_pool, pg_schema, "", {}))
    await sink.send(DeadLetterEntry(  # a version 1 document, from before the rename
        consumer=APP, topic="orders", partition=0, offset=7, key=b"o-1",
        value=b'{"order_id": "o-1", "amount": 250}',
        headers=[("id", b"evt-o-1"), ("event_type", b"order.created"),
                 ("event_version", b"1")],
        reason="handler_failed", detail="outbox table missing", event_id="evt-o-1"))
    app = Consumer(name=APP, handlers=[HandlerRegistry([accept_order, rename_amount])],
                   topics=["orders"],
                   postgres=Postgres(dsn=postgres_dsn, schema=pg_schema),
                   outbox=Outbox(), handle_signals=False)
    first = await replay_dead_letters(app)
    assert (first.replayed, first.failed) == (1, 0)
    # a second entry of the same event id (dead-lettered again from another copy of the
    # record) is absorbed by the dedup claim, and marked replayed
    await sink.send(DeadLetterEntry(
        consumer=APP, topic="orders", partition=0, offset=8, key=b"o-1",
        value=b'{"order_id": "o-1", "amount": 250}',
        headers=[("id", b"evt-o-1"), ("event_type", b"order.created"),
                 ("event_version", b"1")],
        reason="handler_failed", detail="again", event_id="evt-o-1"))
    second = await replay_dead_letters(app)
    assert (second.replayed, second.duplicates) == (0, 1)
    rows = await pg_pool.fetch(
        f"SELECT type, payload FROM {qualified(pg_schema, 'outbox')}")
    assert [(r["type"], json.loads(r["payload"])) for r in rows] == [
        ("order.accepted", {"total_cents": 250})]
    assert await statuses(pg_pool, pg_schema) == {"replayed": 2}


async def test_a_failure_every_entry_would_hit_stops_the_replay_at_once(
    postgres_dsn: str, pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    await bury(pg_pool, pg_schema, letters(keys=3, per_key=2))
    await pg_pool.execute(f'DROP TABLE "{pg_schema}".ledger')  # a deploy that forgot it
    app = consumer(postgres_dsn, pg_schema, Broken(None, 0), CollectorRegistry())
    started = time.monotonic()
    with pytest.raises(DeadLetterError, match=r"replay stopped at dead letter #\d+: 42P01 "
                                              r"UndefinedTableError: relation .*ledger.* does "
                                              r"not exist"):
        await replay_dead_letters(app)
    assert time.monotonic() - started < 30  # not waited on as an outage
    assert await statuses(pg_pool, pg_schema) == {"waiting": 6}
