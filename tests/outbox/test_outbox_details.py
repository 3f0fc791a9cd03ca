"""Outbox details: retention cleanup and its refusals, the fields of the relay's failure logs,
the Debezium connector's columns, a stable ``occurred_at``, the documented defaults, and a
saga step whose failed attempt leaves no outbox row behind."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from uuid import UUID

import asyncpg
import orjson
import pytest

from consumerkit import HandlerContext, Postgres, Retry, RetryPolicy
from consumerkit.errors import ConfigurationError
from consumerkit.outbox import (
    DEFAULT_RETRY,
    KafkaSink,
    Outbox,
    OutboxEvent,
    OutboxTable,
    PermanentSendError,
    Relay,
    cleanup,
    live_relays,
)
from consumerkit.outbox.slots import SlotOwner
from consumerkit.shared.identifiers import identifier
from consumerkit.testing.services import MakeTopic
from consumerkit.transport.kafka import producer_options
from tests.integration.ledger import (
    Running,
    Step,
    build,
    create_ledger,
    ledger_rows,
    make_events,
    publish,
    settled,
    verify,
    wait_for,
)

from ..brokers import PRODUCER_OPTIONS
from ..pooling import POOLER, direct_only
from .conftest import RelayRunning, read_all, wait_until

DOCS = Path(__file__).resolve().parents[2] / "docs"
NO_IDEMPOTENCE = {"enable_idempotence": False}
FAST_RETRY = RetryPolicy(max_attempts=5, initial_delay=0.2, max_delay=0.4)


class ScriptedSink(KafkaSink):
    """The real Kafka sink, scripted per aggregate id: events of a ``refuse`` aggregate are
    refused for good without being sent; the first ``lose[id]`` attempts at an event of
    aggregate ``id`` reach the broker but are reported failed, as when an ack is lost."""

    def __init__(self, bootstrap: str, topic: str, *, refuse: frozenset[str] = frozenset(),
                 lose: dict[str, int] | None = None) -> None:
        super().__init__(bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS))
        self.refuse = refuse
        self.lose = lose or {}
        self.seen: list[OutboxEvent] = []

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        self.seen.extend(events)
        passing = [e for e in events if e.aggregate_id not in self.refuse]
        acked = iter(await super().send(passing) if passing else [])
        results: list[BaseException | None] = []
        for e in events:
            if e.aggregate_id in self.refuse:
                results.append(PermanentSendError("refused by the destination"))
                continue
            result = next(acked)
            if result is None and e.attempts < self.lose.get(e.aggregate_id, 0):
                result = RuntimeError("acknowledgement lost")
            results.append(result)
        return results


def relay_for(dsn: str, table: OutboxTable, sink: KafkaSink) -> Relay:
    return Relay(Postgres(dsn=dsn, schema=table.schema, pooler=POOLER), sink, table=table.table,
                 handle_signals=False,
                 retry=FAST_RETRY)


async def _add(pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox, aggregate: str, *,
               occurred_at: datetime | None = None, dedup_key: str | None = None) -> UUID:
    async with pool.acquire() as conn, conn.transaction():
        added = await outbox.add(conn, event_type=f"{aggregate}.happened", aggregate_type="a",
                                 aggregate_id=aggregate, payload={"aggregate": aggregate},
                                 occurred_at=occurred_at, dedup_key=dedup_key)
    assert added is not None
    return added


# -- cleanup -----------------------------------------------------------------------------------

async def test_cleanup_deletes_only_old_rows_and_keys_in_short_batches(
    pg_pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """Rows older than the age (by ``occurred_at``) and keys older than it (by
    ``created_at``) go, ``batch`` rows per transaction; younger ones stay."""
    t = outbox_table
    now = datetime.now(UTC)
    ages = {"old": timedelta(days=8), "recent": timedelta(days=6), "new": timedelta(0)}
    ids: dict[str, set[UUID]] = {age: set() for age in ages}
    for age, delta in ages.items():
        for n in range(5):
            ids[age].add(await _add(pg_pool, outbox, f"{age}-{n}", occurred_at=now - delta,
                                    dedup_key=f"{age}-{n}"))
        await pg_pool.execute(
            f"UPDATE {t.keys} SET created_at = now() - $1::interval WHERE dedup_key LIKE $2",
            delta, f"{age}-%")
    # every deleted row is logged with the transaction that deleted it
    log = f"{identifier(t.schema)}.deletions"
    await pg_pool.execute(f"""
        CREATE TABLE {log} (tx bigint NOT NULL, target text NOT NULL);
        CREATE FUNCTION {identifier(t.schema)}.log_deletion() RETURNS trigger
        LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO {log} VALUES (txid_current(), TG_TABLE_NAME); RETURN OLD;
        END $$;
        CREATE TRIGGER log_deletion AFTER DELETE ON {t.events}
        FOR EACH ROW EXECUTE FUNCTION {identifier(t.schema)}.log_deletion();
        CREATE TRIGGER log_deletion AFTER DELETE ON {t.keys}
        FOR EACH ROW EXECUTE FUNCTION {identifier(t.schema)}.log_deletion()""")

    async with pg_pool.acquire() as conn:
        deleted = await cleanup(conn, timedelta(days=7), table=t, batch=2)

    assert deleted == 5
    kept = {r["id"] for r in await pg_pool.fetch(f"SELECT id FROM {t.events}")}
    assert kept == ids["recent"] | ids["new"]
    keys = {r["dedup_key"] for r in await pg_pool.fetch(f"SELECT dedup_key FROM {t.keys}")}
    assert keys == {f"{age}-{n}" for age in ("recent", "new") for n in range(5)}
    per_tx = await pg_pool.fetch(f"SELECT target, count(*) AS n FROM {log} GROUP BY tx, target")
    for target in (t.table, f"{t.table}_keys"):
        sizes = sorted(r["n"] for r in per_tx if r["target"] == target)
        assert sizes == [1, 2, 2], target  # 5 rows, at most 2 per transaction


async def test_cleanup_refuses_inside_a_transaction_a_bad_batch_and_a_running_relay(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """Each refusal is a ConfigurationError that says why, and deletes nothing."""
    old = datetime.now(UTC) - timedelta(days=30)
    await _add(pg_pool, outbox, "old", occurred_at=old)
    async with pg_pool.acquire() as conn:
        async with conn.transaction():
            with pytest.raises(ConfigurationError, match="call it outside one"):
                await cleanup(conn, timedelta(days=1), table=outbox_table)
        # bounded: without the check, batches of zero rows would never end
        with pytest.raises(ConfigurationError, match="batch must be at least 1"):
            async with asyncio.timeout(30):
                await cleanup(conn, timedelta(days=1), table=outbox_table, batch=0)
    assert await pg_pool.fetchval(f"SELECT count(*) FROM {outbox_table.events}") == 1

    topic = await make_topic(partitions=1)
    relay = relay_for(postgres_dsn, outbox_table,
                      KafkaSink(kafka_bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS)))
    async with RelayRunning(relay), pg_pool.acquire() as conn:
        await wait_until(lambda: _relays(pg_pool, outbox_table, 1), 30, "the relay connected")
        with pytest.raises(ConfigurationError, match=r"relay of .* is running"):
            await cleanup(conn, timedelta(days=1), table=outbox_table)
    await wait_until(lambda: _relays(pg_pool, outbox_table, 0), 30, "the relay gone")
    await _add(pg_pool, outbox, "old-again", occurred_at=old)
    async with pg_pool.acquire() as conn:
        assert await cleanup(conn, timedelta(days=1), table=outbox_table) == 1


@direct_only("a relay holding session advisory locks (SlotOwner); the lease relay's "
             "refusal is in tests/pooler")
async def test_a_relay_starting_during_a_cleanup_waits_for_its_end(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, outbox: Outbox,
    outbox_table: OutboxTable,
) -> None:
    """Else its pending rows older than the cutoff would be deleted unpublished."""
    old = datetime.now(UTC) - timedelta(days=30)
    await _add(pg_pool, outbox, "old", occurred_at=old)
    async with pg_pool.acquire() as holder, pg_pool.acquire() as conn:
        held = holder.transaction()
        await held.start()  # the cleanup's first batch waits for this row
        await holder.execute(f"SELECT 1 FROM {outbox_table.events} FOR UPDATE")
        cleaning = asyncio.create_task(cleanup(conn, timedelta(days=1), table=outbox_table))
        cleaner = conn.get_server_pid()
        await wait_until(lambda: _waiting(pg_pool, cleaner, "transactionid"), 30,
                         "the cleanup's batch waiting")
        relay = SlotOwner(postgres_dsn, outbox_table, name="late", on_notify=None)
        joining = asyncio.create_task(relay.connect())
        try:
            await wait_until(lambda: _waiting(pg_pool, None, "advisory"), 30,
                             "the relay waiting for the cleanup")
            assert not joining.done()
            await held.rollback()
            assert await asyncio.wait_for(cleaning, 30) == 1
            await asyncio.wait_for(joining, 30)
        finally:
            joining.cancel()
            await relay.close()


async def _waiting(pool: asyncpg.Pool[asyncpg.Record], pid: int | None, lock: str) -> bool:
    """Whether ``pid`` (or any backend) waits for a lock of type ``lock``."""
    return bool(await pool.fetchval(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = $1 "
        "AND ($2::int IS NULL OR pid = $2)", lock, pid))


async def _relays(pool: asyncpg.Pool[asyncpg.Record], table: OutboxTable, n: int) -> bool:
    async with pool.acquire() as conn:
        return await live_relays(conn, table) == n


# -- failure logs ------------------------------------------------------------------------------

async def test_failure_logs_carry_event_id_type_and_attempts(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed attempt logs a WARNING, a FAILED row an ERROR; both carry ``event_id``,
    ``event_type`` and ``attempts`` as record attributes."""
    caplog.set_level(logging.WARNING, logger="consumerkit.outbox")
    topic = await make_topic(partitions=1)
    sink = ScriptedSink(kafka_bootstrap, topic, refuse=frozenset({"poison"}),
                        lose={"flaky": 2})
    poison = await _add(pg_pool, outbox, "poison")
    flaky = await _add(pg_pool, outbox, "flaky")

    def failures(event_id: UUID) -> list[logging.LogRecord]:
        return [r for r in caplog.records if r.name == "consumerkit.outbox"
                and getattr(r, "event_id", None) == str(event_id)]

    async def logged() -> bool:
        return bool(failures(poison)) and len(failures(flaky)) >= 2

    relay = relay_for(postgres_dsn, outbox_table, sink)
    async with RelayRunning(relay):
        await wait_until(logged, 30, "the failures logged")
        await wait_until(lambda: _published(relay, 1), 30, "the flaky event published")

    [refused] = failures(poison)
    assert refused.levelno == logging.ERROR
    assert (refused.__dict__["event_type"], refused.__dict__["attempts"]) == (
        "poison.happened", 1)
    retried = failures(flaky)
    assert [r.levelno for r in retried] == [logging.WARNING, logging.WARNING]
    assert [(r.__dict__["event_type"], r.__dict__["attempts"]) for r in retried] == [
        ("flaky.happened", 1), ("flaky.happened", 2)]


async def _published(relay: Relay, n: int) -> bool:
    return relay.published >= n


# -- Debezium ----------------------------------------------------------------------------------

def _debezium_config() -> dict[str, str]:
    """The connector config of the wire-format page's EventRouter section, which the outbox
    page links to."""
    text = (DOCS / "wire-format.md").read_text()
    start = text.index("\n## Debezium's outbox EventRouter\n")
    end = text.find("\n## ", start + 1)
    block = re.search(r"^```json\n(.*?)^```", text[start:end if end >= 0 else None],
                      re.MULTILINE | re.DOTALL)
    assert block, "no json block in the EventRouter section"
    config: dict[str, str] = json.loads(block.group(1))["config"]
    return config


async def test_every_column_the_debezium_connector_names_exists_in_the_migrated_table(
    pg_pool: asyncpg.Pool[asyncpg.Record], outbox_table: OutboxTable,
) -> None:
    """The columns of the EventRouter config in the docs are all in the outbox table that
    ``consumerkit.migrate`` creates, with the types the docs ask for; and the outbox page
    restates the same settings."""
    config = _debezium_config()
    router = "transforms.outbox."
    named = {v for k, v in config.items()
             if k.startswith(f"{router}table.field.") or k == f"{router}route.by.field"}
    named |= {item.split(":")[0] for item in
              config[f"{router}table.fields.additional.placement"].split(",")}
    # the parse found them
    assert named >= {"id", "aggregateid", "payload", "aggregatetype", "type", "occurred_at"}

    outbox_page = (DOCS / "outbox.md").read_text()
    section = outbox_page[outbox_page.index("\n## Debezium instead of the relay\n"):]
    restated = {m.group(1): m.group(2)
                for m in re.finditer(r"`([a-z.]+)=([^`]+)`", section)}
    assert restated, "the outbox page restates no connector setting"
    for key, value in restated.items():  # the router's settings, or the connector's own
        assert config.get(router + key, config.get(key)) == value, key

    columns = {r["column_name"]: r["data_type"] for r in await pg_pool.fetch(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = $1 AND table_name = $2", outbox_table.schema, outbox_table.table)}
    assert named <= set(columns), sorted(named - set(columns))
    assert columns["id"] == "uuid"
    assert columns["payload"] == "jsonb"
    assert columns["occurred_at"] == "timestamp with time zone"  # emitted as ISO 8601


# -- occurred_at -------------------------------------------------------------------------------

async def test_an_event_carries_its_write_time_not_its_publish_time(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """Written without ``occurred_at`` and published over a second later, the record's
    timestamp and ``occurred_at`` header are the time of the write."""
    topic = await make_topic(partitions=1)
    before = datetime.now(UTC)
    event_id = await _add(pg_pool, outbox, "late")
    after = datetime.now(UTC)
    stored: datetime = await pg_pool.fetchval(
        f"SELECT occurred_at FROM {outbox_table.events} WHERE id = $1", event_id)
    assert before <= stored <= after

    async def a_second_later() -> bool:
        return datetime.now(UTC) >= after + timedelta(seconds=1)

    await wait_until(a_second_later, 10, "a second to pass since the write")
    publishing = datetime.now(UTC)
    relay = relay_for(postgres_dsn, outbox_table,
                      KafkaSink(kafka_bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS)))
    async with RelayRunning(relay):
        await wait_until(lambda: _published(relay, 1), 30, "the event published")
    [record] = await read_all(kafka_bootstrap, [topic], lambda found: len(found) >= 1)

    assert record.headers["id"] == str(event_id).encode()
    assert datetime.fromisoformat(record.headers["occurred_at"].decode()) == stored
    assert record.timestamp == int(stored.timestamp() * 1000)
    assert publishing.timestamp() * 1000 - record.timestamp >= 1000


async def test_a_republished_event_keeps_its_id_and_occurred_at(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """An event whose first ack was lost is sent again after its back-off with the same id,
    ``occurred_at`` header and record timestamp as the first time."""
    topic = await make_topic(partitions=1)
    sink = ScriptedSink(kafka_bootstrap, topic, lose={"again": 1})
    event_id = await _add(pg_pool, outbox, "again")
    stored: datetime = await pg_pool.fetchval(
        f"SELECT occurred_at FROM {outbox_table.events} WHERE id = $1", event_id)
    relay = relay_for(postgres_dsn, outbox_table, sink)
    async with RelayRunning(relay):
        await wait_until(lambda: _published(relay, 1), 30, "the event published")
    assert [e.attempts for e in sink.seen] == [0, 1]
    records = await read_all(kafka_bootstrap, [topic], lambda found: len(found) >= 2)

    assert len(records) == 2
    for record in records:
        assert record.headers["id"] == str(event_id).encode()
        assert datetime.fromisoformat(record.headers["occurred_at"].decode()) == stored
        assert record.timestamp == int(stored.timestamp() * 1000)


# -- defaults ----------------------------------------------------------------------------------

class _Highest(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b


class _Lowest(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return a


async def test_the_default_relay_retry_is_the_documented_back_off(
    postgres_dsn: str, kafka_bootstrap: str,
) -> None:
    """10 attempts, 1 s doubling to 60 s, jittered down to half, as the outbox page says."""
    documented = re.search(r"default\s+of\s+(\d+)\s+attempts,\s+(\d+)\s+s\s+doubling\s+to\s+"
                           r"(\d+)\s+s,\s+and\s+jitter\s+down\s+to\s+half",
                           (DOCS / "outbox.md").read_text())
    assert documented, "the outbox page states no default back-off"
    attempts, initial, cap = (int(g) for g in documented.groups())
    assert (attempts, initial, cap) == (10, 1, 60)

    sink = KafkaSink(kafka_bootstrap, kafka_options=dict(PRODUCER_OPTIONS))
    try:
        relay = Relay(Postgres(dsn=postgres_dsn, pooler=POOLER), sink, handle_signals=False)
    finally:
        await sink.close()
    assert relay.retry is DEFAULT_RETRY
    assert (DEFAULT_RETRY.max_attempts, DEFAULT_RETRY.initial_delay,
            DEFAULT_RETRY.max_delay) == (attempts, initial, cap)
    highest = [DEFAULT_RETRY.delay(n, _Highest()) for n in range(1, 10)]
    assert highest == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    lowest = [DEFAULT_RETRY.delay(n, _Lowest()) for n in range(1, 10)]
    assert lowest == [d / 2 for d in highest]


async def test_the_sink_producer_is_idempotent_with_acks_all_by_default(
    kafka_bootstrap: str,
) -> None:
    """The producer options turn idempotence on unless told otherwise and always ask for
    ``acks=all``; the sink's producer is built with them."""
    assert producer_options({}) == {"enable_idempotence": True, "acks": "all"}
    assert producer_options(NO_IDEMPOTENCE)["acks"] == "all"
    with pytest.raises(ConfigurationError, match="acks=1 is not allowed"):
        producer_options({"acks": 1})

    default = KafkaSink(kafka_bootstrap)
    plain = KafkaSink(kafka_bootstrap, kafka_options=NO_IDEMPOTENCE)
    try:
        # aiokafka keeps a transaction manager only for an idempotent producer; -1 is "all"
        built = default._producer._producer
        assert built._txn_manager is not None
        assert built._sender._acks == -1
        assert plain._producer._producer._txn_manager is None
        assert plain._producer._producer._sender._acks == -1
    finally:
        await default.close()
        await plain.close()


# -- a saga step retried -----------------------------------------------------------------------

async def test_a_failed_saga_attempt_leaves_no_outbox_row(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    """A handler that emits through ``ctx.publish`` and then fails (by ``Retry`` or a plain
    exception) is retried; its first attempt's outbox row rolls back with it, so each event
    leaves exactly one row, the successful attempt's."""
    topic = await make_topic(partitions=2)
    async with pg_pool.acquire() as conn:
        await create_ledger(conn, pg_schema)
    events = make_events(keys=3, per_key=3)
    await publish(kafka_bootstrap, topic, events)
    calls: Counter[str] = Counter()

    async def emit_then_fail_once(event: Step, ctx: HandlerContext) -> None:
        event_id = ctx.envelope.event_id
        calls[event_id] += 1
        await ctx.publish(event_type="step.billed", aggregate_type="ledger",
                          aggregate_id=event.key, payload={"call": calls[event_id]})
        if calls[event_id] == 1:
            if event.seq % 2:
                raise ConnectionAbortedError("downstream hiccup")
            raise Retry(delay=0.01, reason="not yet")

    consumer = build("saga-retry", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     fail=emit_then_fail_once, outbox=Outbox(pg_schema))
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, len(events)), 60, "every event applied")
    assert consumer.stats.applied == len(events)
    assert min(calls[e.event_id] for e in events) >= 2  # each one failed, then succeeded
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
    rows = await pg_pool.fetch(
        f"SELECT headers->>'causation_id' AS cause, payload FROM "
        f"{identifier(pg_schema)}.outbox WHERE type = 'step.billed'")
    assert Counter(r["cause"] for r in rows) == Counter(e.event_id for e in events)
    for r in rows:  # the surviving row is the last, successful call's
        assert orjson.loads(r["payload"])["call"] == calls[r["cause"]]
