"""A saga step: a consumer that emits its own event through ``ctx.publish``, killed with
SIGKILL mid-stream (effects and emitted events committed, offsets not yet) and restarted,
produces each downstream event once in effect, and the relay delivers them."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import asyncpg
import pytest

from consumerkit import Postgres
from consumerkit.outbox import KafkaSink, Relay
from consumerkit.shared.identifiers import identifier
from consumerkit.testing.services import MakeTopic

from ..brokers import PRODUCER_OPTIONS
from ..pooling import POOLER
from .conftest import LedgerTopic
from .ledger import group, ledger_rows, make_events, publish, read_topic, verify, wait_for
from .worker import BILLED

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


async def test_a_crashed_saga_step_emits_each_downstream_event_once(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, make_topic: MakeTopic,
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=3)
    downstream = await make_topic(partitions=2)
    events = make_events(keys=20, per_key=40)
    await publish(kafka_bootstrap, topic, events)
    args = [sys.executable, "-m", "tests.integration.worker", "--dsn", postgres_dsn,
            "--bootstrap", kafka_bootstrap, "--topic", topic, "--schema", pg_schema,
            "--name", group("saga", topic), "--outbox"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen(args, cwd=ROOT, env=env)
    try:
        await wait_for(lambda: _emitted_at_least(pg_pool, pg_schema, 200), 120, "200 emitted")
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        assert await _emitted(pg_pool, pg_schema) < len(events), "the kill lands mid-stream"
        second = subprocess.Popen(args, cwd=ROOT, env=env)
        try:
            await wait_for(lambda: _emitted_at_least(pg_pool, pg_schema, len(events)), 180,
                           "every event emitted after the restart")
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0
        finally:
            _kill(second)
    finally:
        _kill(first)
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
    # one emitted event per upstream event, caused by it: none lost, none twice
    causes = Counter(await _causes(pg_pool, pg_schema))
    assert sorted(causes) == sorted(e.event_id for e in events)
    assert set(causes.values()) == {1}

    relay = Relay(Postgres(dsn=postgres_dsn, schema=pg_schema, pooler=POOLER),
                  KafkaSink(kafka_bootstrap, route=downstream,
                                          kafka_options=dict(PRODUCER_OPTIONS)),
                  handle_signals=False, poll_interval=0.2)
    running = asyncio.create_task(relay.run())
    try:
        delivered = await read_topic(kafka_bootstrap, downstream, len(events))
    finally:
        relay.stop()
        await asyncio.wait_for(running, 30)
    headers = [dict(h) for _, h in delivered]
    assert all(h["event_type"] == BILLED.encode() for h in headers)
    assert sorted(bytes(h["causation_id"] or b"").decode() for h in headers) == sorted(causes)


async def _causes(pool: asyncpg.Pool, schema: str) -> list[str]:
    rows = await pool.fetch(
        f"SELECT headers->>'causation_id' AS cause FROM {identifier(schema)}.outbox "
        "WHERE type = $1", BILLED)
    return [r["cause"] for r in rows]


async def _emitted(pool: asyncpg.Pool, schema: str) -> int:
    return len(await _causes(pool, schema))


async def _emitted_at_least(pool: asyncpg.Pool, schema: str, value: int) -> bool:
    with contextlib.suppress(asyncpg.UndefinedTableError):  # before the consumer migrated
        return await _emitted(pool, schema) >= value
    return False


def _kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


