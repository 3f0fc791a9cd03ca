"""Failing rows: back-off and attempts in the side table, FAILED after the maximum or at once
for a permanent refusal, the aggregate blocked behind it, retry and skip (API and CLI); and a
broker outage on a dedicated broker (its process stopped with SIGSTOP, then continued): the
relay pauses, recovers, loses nothing; so it does when its connection is left broken
mid-operation."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import partial
from uuid import UUID, uuid4

import asyncpg
import orjson
import pytest

from consumerkit import Postgres
from consumerkit.outbox import (
    KafkaSink,
    Outbox,
    OutboxEvent,
    OutboxTable,
    PermanentSendError,
    Relay,
    count_failed,
    skip_failed,
)
from consumerkit.outbox.routing import TopicRoute
from consumerkit.outbox.store import Failure, RelayStore
from consumerkit.outbox.table import SLOTS
from consumerkit.retry import RetryPolicy
from consumerkit.testing.services import MakeTopic, start_tansu
from consumerkit.transport import kafka_access

from ..brokers import PRODUCER_OPTIONS
from ..pooling import POOLER
from .conftest import RelayRunning, pending, read_all, wait_until

FAST_RETRY = RetryPolicy(max_attempts=3, initial_delay=0.2, max_delay=0.4)


class FlakySink(KafkaSink):
    """The real Kafka sink, except that aggregate ``bad`` fails while ``failing`` is set and
    the first event of aggregate ``poison`` is refused for good."""

    failing = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.attempts: dict[UUID, list[float]] = {}

    def _refusal(self, event: OutboxEvent) -> BaseException | None:
        if event.aggregate_id == "bad" and self.failing:
            return RuntimeError("destination busy")
        if event.aggregate_id == "poison" and orjson.loads(event.payload)["n"] == 1:
            return PermanentSendError("refused")
        return None

    async def send(self, events: Sequence[OutboxEvent]) -> list[BaseException | None]:
        passing = [e for e in events if self._refusal(e) is None]
        acked = iter(await super().send(passing) if passing else [])
        results: list[BaseException | None] = []
        for e in events:
            self.attempts.setdefault(e.event_id, []).append(time.monotonic())
            refusal = self._refusal(e)
            results.append(refusal if refusal is not None else next(acked))
        return results


async def _add(outbox: Outbox, pool: asyncpg.Pool[asyncpg.Record], aggregate: str,
               n: int) -> UUID:
    async with pool.acquire() as conn, conn.transaction():
        added = await outbox.add(conn, event_type="e", aggregate_type="a",
                                 aggregate_id=aggregate, payload={"n": n})
    assert added is not None
    return added


async def failed_count(pool: asyncpg.Pool[asyncpg.Record], table: OutboxTable) -> int:
    async with pool.acquire() as conn:
        return await count_failed(conn, table)


def cli(dsn: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "consumerkit", "outbox", *args,
                           "--postgres", dsn], capture_output=True, text=True, timeout=60,
                          check=True)
    return done.stdout


async def test_failed_rows_back_off_fail_block_and_can_be_retried_or_skipped(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    topic = await make_topic(partitions=2)
    sink = FlakySink(kafka_bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS))
    relay = Relay(Postgres(dsn=postgres_dsn, schema=outbox_table.schema, pooler=POOLER), sink,
                  retry=FAST_RETRY,
                  handle_signals=False)
    bad1, bad2 = await _add(outbox, pg_pool, "bad", 1), await _add(outbox, pg_pool, "bad", 2)
    poison1 = await _add(outbox, pg_pool, "poison", 1)
    poison2 = await _add(outbox, pg_pool, "poison", 2)
    good = await _add(outbox, pg_pool, "good", 1)
    schema = ["--schema", outbox_table.schema]

    async def failure(event_id: UUID) -> asyncpg.Record | None:
        return await pg_pool.fetchrow(
            f"SELECT attempts, failed, last_error FROM {outbox_table.failures} "
            "WHERE event_id = $1", event_id)

    async def both_failed() -> bool:
        return await failed_count(pg_pool, outbox_table) == 2

    async with RelayRunning(relay):
        await wait_until(both_failed, 30, "two FAILED rows")
        bad = await failure(bad1)
        assert bad is not None
        assert (bad["attempts"], bad["failed"]) == (3, True)
        assert "destination busy" in bad["last_error"]
        poison = await failure(poison1)
        assert poison is not None
        assert (poison["attempts"], poison["failed"]) == (1, True)
        times = sink.attempts[bad1]
        assert len(times) == 3
        assert times[1] - times[0] >= 0.1
        assert times[2] - times[1] >= 0.2
        # held behind the failed row: tried only in the same batches, after it; never
        # again once it is FAILED; still pending
        assert len(sink.attempts[bad2]) == len(times)
        assert len(sink.attempts[poison2]) == 1
        assert good in sink.attempts
        assert await pending(pg_pool, outbox_table) == 4

        listed = await asyncio.to_thread(cli, postgres_dsn, "failed", *schema)
        assert str(bad1) in listed
        assert str(poison1) in listed
        assert "2 failed events" in listed
        sink.failing = False
        retried = await asyncio.to_thread(cli, postgres_dsn, "retry", "--id", str(bad1),
                                          *schema)
        assert "1 failed events retried" in retried
        async with pg_pool.acquire() as conn:
            assert await skip_failed(conn, [poison1], table=outbox_table) == 1

        async def drained() -> bool:
            return await pending(pg_pool, outbox_table) == 0

        await wait_until(drained, 30, "the outbox drained after retry and skip")
        assert await failed_count(pg_pool, outbox_table) == 0

    wanted = {bad1, bad2, poison2, good}
    records = await read_all(kafka_bootstrap, [topic], lambda found: wanted <= {
        UUID(r.headers["id"].decode()) for r in found})
    ids = [UUID(r.headers["id"].decode()) for r in records]
    assert poison1 not in ids  # skipped: never published
    firsts = list(dict.fromkeys(ids))
    assert firsts.index(bad1) < firsts.index(bad2)  # retried, still in order
    assert poison2 in ids
    assert good in ids


async def test_a_failure_recorded_for_a_row_published_meanwhile_blocks_nothing(
    pg_pool: asyncpg.Pool[asyncpg.Record], outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """A relay that lost its slot mid-batch records its failures after another relay has
    published and deleted the rows: those failures must not hold the aggregate back."""
    await _add(outbox, pg_pool, "x", 1)
    await _add(outbox, pg_pool, "x", 2)
    store = RelayStore(outbox_table)
    slots = range(SLOTS)
    async with pg_pool.acquire() as conn:
        first, second = await store.claim(conn, slots, 10)
        await store.delete(conn, [first.seq])  # the other relay published it
        await store.record_failures(conn, [Failure(first, "timed out", 3600.0, True)])
        assert await count_failed(conn, outbox_table) == 0  # nothing recorded for a gone row
        # one recorded as the other relay deleted the row (its statement came first)
        await conn.execute(
            f"INSERT INTO {outbox_table.failures} (seq, event_id, event_type, aggregatetype, "
            "aggregateid, attempts, last_error, next_attempt_at, failed) "
            "VALUES ($1, $2, 'e', 'a', 'x', 5, 'timed out', now() + interval '1 hour', true)",
            first.seq, first.event_id)
        assert [e.seq for e in await store.claim(conn, slots, 10)] == [second.seq]


async def test_a_broker_outage_pauses_the_relay_and_loses_nothing(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, outbox: Outbox,
    outbox_table: OutboxTable,
) -> None:
    broker = await asyncio.to_thread(start_tansu)
    topic, stopped = "ck-outage", False
    sink = KafkaSink(broker.bootstrap, route=topic, auto_create_topics=True, kafka_options={
        "enable_idempotence": False, "request_timeout_ms": 2000, "metadata_max_age_ms": 1000})
    relay = Relay(Postgres(dsn=postgres_dsn, schema=outbox_table.schema, pooler=POOLER), sink,
                  handle_signals=False,
                  retry=RetryPolicy(max_attempts=3, initial_delay=0.2, max_delay=1.0))
    try:
        async with RelayRunning(relay):
            before = [await _add(outbox, pg_pool, f"agg-{n % 3}", n) for n in range(5)]

            async def published(n: int) -> bool:
                return relay.published >= n

            await wait_until(lambda: published(5), 30, "events published before the outage")
            seen = await read_all(broker.bootstrap, [topic], lambda found: len(found) >= 5)
            assert {UUID(r.headers["id"].decode()) for r in seen} == set(before)

            os.kill(broker.pid, signal.SIGSTOP)  # the broker stops answering, keeps its data
            stopped = True
            during = [await _add(outbox, pg_pool, f"agg-{n % 3}", n) for n in range(5, 25)]

            async def paused() -> bool:
                return relay.pauses >= 2

            await wait_until(paused, 60, "the relay pausing for the outage")
            assert await pending(pg_pool, outbox_table) == 20
            os.kill(broker.pid, signal.SIGCONT)
            stopped = False

            async def drained() -> bool:
                return await pending(pg_pool, outbox_table) == 0

            await wait_until(drained, 60, "the outbox drained after the outage")
        assert await failed_count(pg_pool, outbox_table) == 0
        records = await read_all(broker.bootstrap, [topic], lambda found: {
            UUID(r.headers["id"].decode()) for r in found} >= set(during))
        ids = [UUID(r.headers["id"].decode()) for r in records]
        for aggregate in range(3):
            mine = [e for n, e in enumerate(during, start=5) if n % 3 == aggregate]
            assert [i for i in dict.fromkeys(ids) if i in mine] == mine
    finally:
        if stopped:
            os.kill(broker.pid, signal.SIGCONT)
        await asyncio.to_thread(broker.stop)


async def test_a_connection_left_mid_operation_pauses_the_relay_and_loses_nothing(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    make_topic: MakeTopic, outbox: Outbox, outbox_table: OutboxTable,
) -> None:
    """Regression (the long torture run: a relay exited four times). When a backend dies
    under an operation, asyncpg may report the connection's next statement as an
    InternalClientError ("another operation is in progress"). The relay took it for a bug
    and exited; it is an outage: pause, reconnect, publish everything."""
    topic = await make_topic(partitions=1)
    sink = KafkaSink(kafka_bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS))
    relay = Relay(Postgres(dsn=postgres_dsn, schema=outbox_table.schema, pooler=POOLER), sink,
                  handle_signals=False,
                  retry=RetryPolicy(max_attempts=3, initial_delay=0.05, max_delay=0.1))
    claim = relay._store.claim
    broken: list[int] = []

    async def left_mid_operation(*args: object, **kwargs: object) -> list[OutboxEvent]:
        if len(broken) < 2:  # twice in a row, as after a backend died mid-query
            broken.append(1)
            raise asyncpg.InternalClientError(
                "cannot switch to state 12; another operation (2) is in progress")
        return await claim(*args, **kwargs)  # type: ignore[arg-type]

    relay._store.claim = left_mid_operation  # type: ignore[method-assign]
    written = [await _add(outbox, pg_pool, f"agg-{n % 2}", n) for n in range(6)]
    async with RelayRunning(relay):
        async def drained() -> bool:
            return await pending(pg_pool, outbox_table) == 0

        await wait_until(drained, 60, "the outbox drained after the broken connection")
        assert relay.pauses == 2
    records = await read_all(kafka_bootstrap, [topic], lambda found: len(found) >= 6)
    assert [UUID(r.headers["id"].decode()) for r in records] == written


async def test_a_fixed_route_created_just_after_the_start_is_waited_for(
    kafka_bootstrap: str, make_topic: MakeTopic, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The relay's topic appears while it starts (a topic operator racing the deployment);
    the wait is made long here, so a slow machine cannot outlast it."""
    monkeypatch.setattr(kafka_access, "TOPIC_GRACE", 60.0)
    caplog.set_level(logging.INFO, "consumerkit.outbox")
    topic = f"ck-t-late-{uuid4().hex[:8]}"
    sink = KafkaSink(kafka_bootstrap, route=topic, kafka_options=dict(PRODUCER_OPTIONS))
    opening = asyncio.create_task(sink.open())
    try:
        await wait_until(partial(_logged, caplog, f"topics not on the broker yet: {topic};"),
                         30, "the relay waiting for its topic")
        assert not opening.done()
        await make_topic(partitions=1, name=topic)
        await asyncio.wait_for(opening, 60)
    finally:
        if not opening.done():
            opening.cancel()
        await sink.close()


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


async def test_a_routed_topic_missing_for_good_backs_off_the_relay_s_pauses(
    pg_pool: asyncpg.Pool[asyncpg.Record], postgres_dsn: str, kafka_bootstrap: str,
    outbox: Outbox, outbox_table: OutboxTable, caplog: pytest.LogCaptureFixture,
) -> None:
    """A templated route naming a topic nobody created fails every batch whole: the relay
    pauses. Each pause must wait longer than the last (the log said so every 0.8 s before,
    forever): a round that pauses is no round that went well."""
    caplog.set_level(logging.WARNING, "consumerkit.outbox")
    async with pg_pool.acquire() as conn, conn.transaction():
        await outbox.add(conn, event_type="e", aggregate_type=f"missing-{uuid4().hex[:8]}",
                         aggregate_id="a-1", payload={"n": 1})
    sink = KafkaSink(kafka_bootstrap, route=TopicRoute("{aggregate_type}"),
                     kafka_options=dict(PRODUCER_OPTIONS))
    relay = Relay(Postgres(dsn=postgres_dsn, schema=outbox_table.schema, pooler=POOLER), sink,
                  handle_signals=False,
                  retry=RetryPolicy(max_attempts=10, initial_delay=0.2, max_delay=5.0))
    async with RelayRunning(relay):
        async def paused_four_times() -> bool:
            return relay.pauses >= 4

        await wait_until(paused_four_times, 60, "four pauses")
    delays = [r.args[1] for r in caplog.records
              if "paused for" in r.getMessage() and isinstance(r.args, tuple)
              and isinstance(r.args[1], float)]
    assert len(delays) >= 4, delays
    # the n-th pause waits in [base/2, base], base = 0.2 * 2 ** (n - 1): the fourth at least
    # 0.8 s, past anything the first could wait
    assert delays[3] >= 0.8 > 0.2 >= delays[0], delays

