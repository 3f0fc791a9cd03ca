"""The ``debezium`` torture profile, short form: a writer commits events of many aggregates at
a steady rate while seeded faults hit the path (the Connect worker SIGKILLed and started again,
PostgreSQL crashed and restarted, the consumer stopped and started again); then every event
must be applied exactly once, per aggregate in order, and the figures are printed.

Counted as for the relay's torture: events committed, records on the topic (re-sent copies
among them), effects, duplicate effects, lost events and order violations."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from ..outbox.conftest import read_all
from .conftest import Cdc, MakeCdc
from .flow import STEP, TRACE, Step, Written, applied, consuming, wait_applied
from .test_worker import ids_of

pytestmark = pytest.mark.slow

SEED = 27
AGGREGATES = 20
ROUNDS = 75  # events per aggregate: 1,500 in all
RATE = 60.0  # events per second the writer aims at: 25 s of writing, faults throughout
FAULTS = ("connect_sigkill", "postgres_restart", "consumer_restart")


async def _connect(dsn: str) -> asyncpg.Connection[asyncpg.Record]:
    for _ in range(200):  # a restart in progress: bounded
        try:
            return await asyncpg.connect(dsn, timeout=5)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            await asyncio.sleep(0.1)
    raise TimeoutError(f"PostgreSQL at {dsn} did not come back")


async def steady_writer(cdc: Cdc, written: list[Written]) -> None:
    """One event per transaction at RATE, each with an id chosen before the attempt, so a
    commit whose answer was lost in a crash is not written twice: the retry finds its id."""
    conn = await _connect(cdc.postgres.dsn)
    start = time.monotonic()
    try:
        for i in range(ROUNDS * AGGREGATES):
            await asyncio.sleep(max(0.0, start + i / RATE - time.monotonic()))
            n, key = divmod(i, AGGREGATES)
            event_id, trace = uuid.uuid4(), TRACE.format(uuid.uuid4().int)
            while True:
                try:
                    async with conn.transaction():
                        await cdc.outbox.add(
                            conn, event_type=STEP, aggregate_type=cdc.topic,
                            aggregate_id=f"k{key}", payload=Step(key=f"k{key}", n=n),
                            headers={"traceparent": trace}, event_id=event_id)
                    break
                except asyncpg.UniqueViolationError:
                    break  # the crashed attempt committed
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                    conn.terminate()
                    conn = await _connect(cdc.postgres.dsn)
            written.append(Written(str(event_id), f"k{key}", n, trace))
    finally:
        conn.terminate()


async def test_the_debezium_profile_short_loses_and_duplicates_nothing(
    make_cdc: MakeCdc,
) -> None:
    rng = random.Random(SEED)
    cdc = await make_cdc(4)
    worker = await asyncio.to_thread(cdc.start)
    dsn, schema, bootstrap = cdc.postgres.dsn, cdc.table.schema, cdc.kafka.bootstrap
    written: list[Written] = []
    faults: Counter[str] = Counter()
    name = f"torture-{schema}".replace("_", "-")
    consumer = consuming(dsn, bootstrap, schema, [cdc.topic], name=name)
    await consumer.__aenter__()

    async def restart_consumer() -> None:
        nonlocal consumer
        await consumer.__aexit__(None, None, None)
        consumer = consuming(dsn, bootstrap, schema, [cdc.topic], name=name)
        await consumer.__aenter__()

    def kill_and_start_worker() -> None:
        worker.kill()
        worker.start()

    actions: dict[str, Callable[[], Awaitable[None]]] = {
        "connect_sigkill": lambda: asyncio.to_thread(kill_and_start_worker),
        "postgres_restart": lambda: asyncio.to_thread(cdc.postgres.restart),
        "consumer_restart": restart_consumer,
    }
    started = time.monotonic()
    try:
        writing = asyncio.create_task(steady_writer(cdc, written))
        await asyncio.sleep(2)  # warm-up without faults
        plan = rng.sample(FAULTS, len(FAULTS)) + [rng.choice(FAULTS) for _ in range(5)]
        for kind in plan:
            if writing.done():
                break
            await actions[kind]()
            faults[kind] += 1
            await asyncio.sleep(rng.uniform(0.5, 1.5))
        await writing
        await asyncio.to_thread(worker.wait_running)  # the task reconnects after a crash
        await wait_applied(dsn, schema, len(written), timeout=300)
        drained = time.monotonic() - started
        records = await read_all(bootstrap, [cdc.topic], lambda found: {
            w.event_id for w in written} <= set(ids_of(found)), timeout=120)
    finally:
        await consumer.__aexit__(None, None, None)

    rows = [r for r in await applied(dsn, schema) if r["event_type"] == STEP]
    ids = Counter(r["event_id"] for r in rows)
    expected = {w.event_id for w in written}
    per_key: dict[str, list[int]] = {}
    for r in rows:
        per_key.setdefault(r["key"], []).append(r["n"])
    figures = {
        "profile": "debezium-short", "seed": SEED, "events_committed": len(written),
        "records_on_topic": len(records),
        "resent_copies": len(records) - len(set(ids_of(records))),
        "effects": len(rows), "duplicate_effects": sum(c - 1 for c in ids.values() if c > 1),
        "lost": len(expected - set(ids)), "phantom": len(set(ids) - expected),
        "order_violations": sum(ns != sorted(ns) for ns in per_key.values()),
        "faults_by_kind": dict(sorted(faults.items())), "seconds": round(drained, 1),
    }
    print(f"\ndebezium torture: {json.dumps(figures)}")
    assert len(written) == ROUNDS * AGGREGATES
    assert set(faults) == set(FAULTS), faults  # every kind happened under load
    assert (figures["lost"], figures["duplicate_effects"], figures["phantom"],
            figures["order_violations"]) == (0, 0, 0, 0), figures
