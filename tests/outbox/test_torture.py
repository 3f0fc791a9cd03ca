"""10,000 events over 100 aggregates from concurrent writers (some roll back, some hold their
transaction open for seconds), published by two relay processes, one SIGKILLed mid-run and
restarted. Judged from the broker: nothing lost, nothing rolled back, per-aggregate order of
first occurrences equal to commit order; duplicates counted, printed and bounded by the one
batch the killed relay can have had in flight. The negative controls
(deliberately broken relays that this checker must catch) are in ``test_torture_controls.py``."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from uuid import UUID

import asyncpg
import orjson
import pytest

from consumerkit.outbox import NewEvent, Outbox, OutboxTable
from consumerkit.shared.identifiers import identifier
from consumerkit.testing.services import MakeTopic

from .conftest import Published, pending, read_all, wait_until

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 10_000
AGGREGATES = 100
WRITERS = 12


def start_relay(dsn: str, bootstrap: str, schema: str, topic: str,
                name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.outbox.relay_worker", "--dsn", dsn, "--bootstrap",
         bootstrap, "--schema", schema, "--topic", topic, "--name", name],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


class Workload:
    def __init__(self, outbox: Outbox, schema: str, seed: int, events: int = EVENTS) -> None:
        self.outbox = outbox
        self.events = events
        self.counters = f"{identifier(schema)}.counters"
        self.rng = random.Random(seed)
        self.committed: dict[UUID, tuple[str, int]] = {}
        self.rolled_back: set[UUID] = set()
        self.held_open = 0

    async def writer(self, pool: asyncpg.Pool[asyncpg.Record]) -> None:
        while len(self.committed) < self.events:
            aggregate = f"agg-{self.rng.randrange(AGGREGATES)}"
            count = min(self.rng.randint(1, 3), self.events - len(self.committed))
            roll_back = self.rng.random() < 0.05
            hold = 0.0 if roll_back or self.rng.random() > 0.004 else self.rng.uniform(1, 2.5)
            ids: list[UUID] = []
            seqs: list[int] = []
            try:
                async with pool.acquire() as conn, conn.transaction():
                    # the business write: the aggregate's row, its sequence per event
                    last = await conn.fetchval(
                        f"UPDATE {self.counters} SET n = n + $2 WHERE aggregate = $1 "
                        "RETURNING n", aggregate, count)
                    seqs = list(range(last - count + 1, last + 1))
                    ids = await self.outbox.add_many(conn, [
                        NewEvent("step.recorded", "ledger", aggregate,
                                 {"aggregate": aggregate, "seq": s}) for s in seqs])
                    if hold:
                        self.held_open += 1
                        await asyncio.sleep(hold)  # a long transaction, part of the workload
                    if roll_back:
                        raise _RollBack
            except _RollBack:
                self.rolled_back.update(ids)
                continue
            for event_id, seq in zip(ids, seqs, strict=True):
                self.committed[event_id] = (aggregate, seq)


class _RollBack(Exception):
    pass


def check(records: list[Published], work: Workload) -> tuple[int, int]:
    """Fail on lost, phantom or out-of-order events; return (deliveries, duplicates)."""
    ids = [UUID(r.headers["id"].decode()) for r in records]
    seen = Counter(ids)
    lost = set(work.committed) - set(seen)
    phantom = work.rolled_back & set(seen)
    assert not lost, f"{len(lost)} committed events never published"
    assert not phantom, f"{len(phantom)} rolled-back events published"
    first_order: dict[str, list[int]] = {}
    firsts: set[UUID] = set()
    for event_id, record in zip(ids, records, strict=True):
        if event_id in firsts:
            continue
        firsts.add(event_id)
        payload = orjson.loads(record.value or b"")
        assert work.committed[event_id] == (payload["aggregate"], payload["seq"])
        first_order.setdefault(payload["aggregate"], []).append(payload["seq"])
    for aggregate, order in first_order.items():
        assert order == list(range(1, len(order) + 1)), f"order violated on {aggregate}"
    return len(records), sum(n - 1 for n in seen.values())


@pytest.mark.slow
async def test_two_relays_one_killed_nothing_lost_or_reordered(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, outbox: Outbox,
    outbox_table: OutboxTable,
) -> None:
    topic = await make_topic(partitions=8)
    schema = outbox_table.schema
    pool = await asyncpg.create_pool(postgres_dsn, min_size=WRITERS, max_size=WRITERS + 2)
    assert pool is not None
    await pool.execute(f"CREATE TABLE {identifier(schema)}.counters "
                       "(aggregate text PRIMARY KEY, n int NOT NULL DEFAULT 0)")
    await pool.execute(f"INSERT INTO {identifier(schema)}.counters (aggregate) "
                       f"SELECT 'agg-' || i FROM generate_series(0, {AGGREGATES - 1}) i")
    work = Workload(outbox, schema, seed=7)
    relays = [start_relay(postgres_dsn, kafka_bootstrap, schema, topic, f"r{i}")
              for i in range(2)]
    started = time.monotonic()
    try:
        writers = [asyncio.create_task(work.writer(pool)) for _ in range(WRITERS)]

        async def a_third_written() -> bool:
            return len(work.committed) >= EVENTS // 3

        await wait_until(a_third_written, 60, "a third of the events committed")
        relays[0].send_signal(signal.SIGKILL)
        relays[0].wait(10)
        killed_at = len(work.committed)
        relays[0] = start_relay(postgres_dsn, kafka_bootstrap, schema, topic, "r0-restarted")
        await asyncio.gather(*writers)

        async def drained() -> bool:
            assert all(r.poll() is None for r in relays), "a relay process died"
            return await pending(pool, outbox_table) == 0

        await wait_until(drained, 60, "the outbox drained")
        drain_time = time.monotonic() - started
    finally:
        for r in relays:
            if r.poll() is None:
                r.send_signal(signal.SIGTERM)
        for r in relays:
            r.wait(30)
        await pool.close()
    assert [r.returncode for r in relays] == [0, 0]

    committed = set(work.committed)
    records = await read_all(kafka_bootstrap, [topic], lambda found: committed <= {
        UUID(r.headers["id"].decode()) for r in found}, timeout=60)
    deliveries, duplicates = check(records, work)
    print(f"\ncommitted {len(committed)} events, rolled back {len(work.rolled_back)}, "
          f"{work.held_open} transactions held open; relay SIGKILLed after {killed_at} "
          f"commits; drained in {drain_time:.1f}s; broker: {deliveries} deliveries, "
          f"{duplicates} duplicates, 0 lost, 0 phantom, 0 order violations")
    assert len(committed) >= EVENTS
    assert work.rolled_back
    assert work.held_open, "no writer held its transaction open"
    assert killed_at < EVENTS, "the kill must land mid-run"
    # slots are exclusive, so only the batch the killed relay had sent but not yet deleted
    # can go out twice: at most one batch (200) per kill
    assert duplicates <= 200, f"{duplicates} duplicates from one kill"

