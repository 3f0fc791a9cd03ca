"""Parking under TestConsumer (the production engine fed from memory, a real PostgreSQL):
what parks and what is still dead-lettered, and a replay after the fix."""

from __future__ import annotations

import asyncpg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from consumerkit import Postgres, RetryPolicy, StartupError, migrate
from consumerkit.engine.replay import replay_key
from consumerkit.observability.tracing import Tracing
from consumerkit.testing import TestConsumer

from .moves import BROKEN, Move, move, moves


async def test_a_key_parks_a_keyless_record_and_a_dead_letter_do_not_and_replay_applies(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute("CREATE TABLE moves (id bigserial, key text, seq int)")
        BROKEN.add(2)
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        async with TestConsumer([move],
                                postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                                retry=RetryPolicy(max_attempts=2, initial_delay=0.0),
                                partitions=1,
                                observers=[Tracing(tracer_provider=provider)]) as kit:
            for seq in (1, 2, -2, 3):  # -2 joins the park: its DeadLetter comes at the replay
                kit.publish(Move(seq=seq), key="a")
            kit.publish(Move(seq=7), key="b")
            kit.publish(Move(seq=2), key=None)  # no key to park: dead-lettered
            kit.publish(Move(seq=-1), key="c")  # DeadLetter raised: dead-lettered
            await kit.drain(fail_fast=False)
            ids = [dict(r.headers)["id"] for r in kit.broker.records("events", 0)[1:4]]
            assert [s.event_id for s in kit.parked] == [i.decode() for i in ids if i]
            assert sorted(e.reason for e in kit.dead_letters) == [
                "dead_lettered_by_handler", "handler_failed"]
            assert kit.stats.parked == 3
            parked = [s for s in exporter.get_finished_spans()
                      if (s.attributes or {}).get("consumerkit.outcome") == "parked"]
            assert [(s.attributes or {}).get("messaging.kafka.message.offset")
                    for s in parked] == [1, 2, 3]
            assert [s.status.status_code for s in parked] == [
                StatusCode.ERROR, StatusCode.UNSET, StatusCode.UNSET]
            BROKEN.clear()
            report = await replay_key(kit.consumer, b"a")
            assert (report.applied, report.dead_lettered, report.records) == (2, 1, 3)
            assert sorted(e.reason for e in kit.dead_letters) == [
                "dead_lettered_by_handler", "dead_lettered_by_handler", "handler_failed"]
        rows = await conn.fetch("SELECT key, seq FROM moves ORDER BY id")
        assert [r["seq"] for r in rows if r["key"] == "a"] == [1, 2, 3]
        assert [r["seq"] for r in rows if r["key"] != "a"] == [7]
    finally:
        BROKEN.clear()
        await conn.close()


async def test_a_batch_handler_parks_the_culprit_s_key_and_replays_through_it(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute("CREATE TABLE moves (id bigserial, key text, seq int)")
        BROKEN.add(12)
        async with TestConsumer([moves],
                                postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                                partitions=1,
                                retry=RetryPolicy(max_attempts=2, initial_delay=0.0)) as kit:
            for seq in range(10, 15):
                kit.publish(Move(seq=seq), key="a")
                kit.publish(Move(seq=seq + 10), key="b")
            await kit.drain(fail_fast=False)
            assert kit.stats.parked == 3  # 12, then 13 and 14 behind it
            BROKEN.clear()
            report = await replay_key(kit.consumer, b"a")
            assert (report.applied, report.records) == (3, 3)
        rows = await conn.fetch("SELECT key, seq FROM moves ORDER BY id")
        assert [r["seq"] for r in rows if r["key"] == "a"] == [10, 11, 12, 13, 14]
        assert [r["seq"] for r in rows if r["key"] == "b"] == [20, 21, 22, 23, 24]
    finally:
        BROKEN.clear()
        await conn.close()


async def test_a_consumer_that_parks_refuses_to_start_without_the_tables(
    consumerkit_dsn: str, consumerkit_schema: str,
) -> None:
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await migrate(conn, consumerkit_schema)
        await conn.execute(f'DROP TABLE "{consumerkit_schema}".parked_records')
    finally:
        await conn.close()
    kit = TestConsumer([move],
                       postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                       migrate=False)
    with pytest.raises(StartupError, match=(
            f"on_exhausted='park' needs the table {consumerkit_schema}.parked_records: run "
            "consumerkit migrate")):
        await kit.start()
