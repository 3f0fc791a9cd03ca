"""Handler failures, poison and bad input end in the dead-letter destination; the consumer
keeps running; start-up problems are clear errors."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from functools import partial

import asyncpg
import pytest

from consumerkit import (
    DeadLetterEntry,
    DeadLetterTable,
    DeadLetterTopic,
    HandlerContext,
    Kafka,
    Limits,
    RetryPolicy,
    StartupError,
    Timeouts,
)
from consumerkit.deadletter.table import list_dead_letters
from consumerkit.testing.services import MakeTopic
from consumerkit.transport import kafka_access

from ..brokers import PRODUCER_OPTIONS
from .conftest import LedgerTopic
from .ledger import (
    Running,
    Step,
    build,
    create_ledger,
    ledger_rows,
    make_events,
    publish,
    publish_raw,
    read_topic,
    settled,
    verify,
    wait_for,
)


async def dead_letters(pool: asyncpg.Pool, schema: str) -> list[DeadLetterEntry]:
    async with pool.acquire() as conn:
        return list(await list_dead_letters(conn, schema, limit=1000))


async def test_flaky_handler_applies_once_and_poison_is_dead_lettered(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=2)
    attempts: Counter[str] = Counter()

    async def fail(event: Step, ctx: HandlerContext) -> None:
        attempts[ctx.envelope.event_id] += 1
        if event.key == "key-0" and event.seq == 2 and ctx.attempt <= 2:
            raise ConnectionAbortedError("flaky downstream")  # fails twice, then succeeds
        if event.key == "key-1" and event.seq == 3:
            raise ValueError("this event can never be applied")

    events = make_events(keys=5, per_key=10)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("flaky", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=fail,
                     limits=Limits(max_message_bytes=4096))
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, len(events)), 60, "every event settled")
    poison = "evt-1-3"
    applied = [e for e in events if e.event_id != poison]
    async with pg_pool.acquire() as conn:
        ledger = await ledger_rows(conn, pg_schema)
    assert attempts["evt-0-2"] == 3
    assert attempts[poison] == 4  # max_attempts, then dead-lettered
    assert [r["event_id"] for r in ledger].count("evt-0-2") == 1
    assert poison not in {r["event_id"] for r in ledger}
    letters = await dead_letters(pg_pool, pg_schema)
    assert len(letters) == 1
    letter = letters[0]
    assert letter.reason == "handler_failed"
    assert "ValueError: this event can never be applied" in letter.detail
    assert letter.attempts == 4
    assert letter.event_id == poison
    # later messages of every key were applied, the poisoned key's included
    assert {r["event_id"] for r in ledger} == {e.event_id for e in applied}
    assert consumer.stats.retries == 2 + 3


async def test_every_kind_of_bad_input_is_dead_lettered_and_the_consumer_keeps_running(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, ledger_topic: LedgerTopic,
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=1)
    dlq_topic = await make_topic(partitions=1)
    typed = ("event_type", b"step.recorded")
    good = b'{"key": "k", "seq": 1}'
    bad: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]] = [
        (b"k", b"{not json", [("id", b"bad-json"), typed]),
        (b"k", good, [typed]),
        (b"k", good, [("id", b"unknown"), ("event_type", b"step.unheard_of")]),
        (b"k", b'{"key": "k", "seq": "first"}', [("id", b"invalid"), typed]),
        (b"k", b'{"key": "k", "seq": 1, "pad": "' + b"x" * 5000 + b'"}', [("id", b"big"), typed]),
        (b"k", good, [("id", b"no-type")]),
        (b"\xff\xfe", good, [("id", b"bad-key"), typed]),
        (b"k", None, [("id", b"tombstone"), typed]),
    ]
    await publish_raw(kafka_bootstrap, topic, bad)
    events = make_events(keys=1, per_key=1, prefix="good")
    await publish(kafka_bootstrap, topic, events)
    consumer = build("strict", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     limits=Limits(max_message_bytes=4096),
                    dead_letter=[DeadLetterTable(), DeadLetterTopic(
                        dlq_topic, producer_options=dict(PRODUCER_OPTIONS))])
    async with Running(consumer) as running:
        await wait_for(lambda: settled(consumer, len(bad) + 1), 60, "every record settled")
        assert running.stats.applied == 1
    letters = await dead_letters(pg_pool, pg_schema)
    reasons = sorted(letter.reason for letter in letters)
    assert reasons == sorted([
        "invalid_json", "missing_event_id", "unknown_event_type", "invalid_payload",
        "oversized", "missing_event_type", "invalid_key", "empty_value"])
    by_reason = {x.reason: x for x in letters}
    assert by_reason["invalid_json"].value == b"{not json"
    assert by_reason["invalid_key"].key == b"\xff\xfe"
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)
    published = await read_topic(kafka_bootstrap, dlq_topic, len(bad))
    assert sorted(bytes(dict(h)["consumerkit.reason"] or b"").decode()
                  for _, h in published) == reasons
    assert {v for v, _ in published} >= {b"{not json", good}


async def test_unreachable_postgres_is_a_clear_startup_error_without_the_password(
    kafka_bootstrap: str, make_topic: MakeTopic,
) -> None:
    topic = await make_topic(partitions=1)
    consumer = build("nodb", "ck_nodb", topic, "postgresql://app:hunter2@127.0.0.1:1/app",
                    kafka_bootstrap)
    with pytest.raises(StartupError) as info:
        await asyncio.wait_for(consumer.run(), 60)
    assert "cannot connect to PostgreSQL" in str(info.value)
    assert "hunter2" not in str(info.value)
    assert "app:***@127.0.0.1:1" in str(info.value)


async def test_unreachable_broker_and_missing_topics_are_clear_startup_errors(
    postgres_dsn: str, kafka_bootstrap: str, pg_schema: str,
) -> None:
    nobroker = build("nobroker", pg_schema, "orders", postgres_dsn, "127.0.0.1:1",
                     kafka=Kafka(options={"request_timeout_ms": 3000}))
    with pytest.raises(StartupError, match="cannot reach the Kafka broker"):
        await asyncio.wait_for(nobroker.run(), 60)
    missing = build("notopic", pg_schema, "ck-missing-topic-xyz", postgres_dsn, kafka_bootstrap)
    with pytest.raises(StartupError, match="topics missing on the broker: ck-missing-topic-xyz"):
        await asyncio.wait_for(missing.run(), 60)



async def test_a_topic_created_just_after_the_start_is_waited_for(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A topic operator racing the deployment: the dead-letter topic, then the topic, appear
    while the consumer starts (the wait is made long here, so a slow machine cannot outlast
    it)."""
    monkeypatch.setattr(kafka_access, "TOPIC_GRACE", 60.0)
    caplog.set_level(logging.INFO, "consumerkit")
    topic = f"ck-t-late-{uuid.uuid4().hex[:8]}"
    async with pg_pool.acquire() as conn:
        await create_ledger(conn, pg_schema)
    consumer = build("late", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     dead_letter=DeadLetterTopic(producer_options=dict(PRODUCER_OPTIONS)))
    running = Running(consumer)
    starting = asyncio.create_task(running.__aenter__())
    try:
        await wait_for(partial(_logged, caplog, f"topics not on the broker yet: {topic}.dlq"),
                       30, "the consumer waiting for its dead-letter topic")
        await make_topic(partitions=1, name=f"{topic}.dlq")
        await wait_for(partial(_logged, caplog, f"topics not on the broker yet: {topic};"), 30,
                       "the consumer waiting for its topic")
        assert not starting.done()
        events = make_events(keys=2, per_key=3)
        await make_topic(partitions=2, name=topic)
        await publish(kafka_bootstrap, topic, events)
        await asyncio.wait_for(starting, 60)
        await wait_for(lambda: settled(consumer, len(events)), 60, "every event applied")
    finally:
        if not starting.done():
            starting.cancel()
        await running.__aexit__(None, None, None)
    async with pg_pool.acquire() as conn:
        verify(await ledger_rows(conn, pg_schema), events)


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


pytestmark = pytest.mark.slow


async def test_a_missing_dead_letter_topic_is_a_clear_startup_error(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
) -> None:
    topic = await make_topic(partitions=1)
    consumer = build("nodlq", pg_schema, topic, postgres_dsn, kafka_bootstrap,
                     dead_letter=DeadLetterTopic(producer_options=dict(PRODUCER_OPTIONS)))
    missing = f"dead-letter topics missing on the broker: {topic}.dlq"
    with pytest.raises(StartupError, match=missing):
        await asyncio.wait_for(consumer.run(), 60)


async def test_a_hanging_handler_times_out_and_is_dead_lettered(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool,
) -> None:
    topic = await ledger_topic(partitions=1)
    forever = asyncio.Event()

    async def hang(event: Step, ctx: HandlerContext) -> None:
        if event.seq == 1:
            await forever.wait()  # never set: only the handler timeout ends this

    events = make_events(keys=1, per_key=2)
    await publish(kafka_bootstrap, topic, events)
    consumer = build("hang", pg_schema, topic, postgres_dsn, kafka_bootstrap, fail=hang,
                     timeouts=Timeouts(handler=0.2),
                     retry=RetryPolicy(max_attempts=2, initial_delay=0.01, max_delay=0.02))
    async with Running(consumer):
        await wait_for(lambda: settled(consumer, 2), 60, "both records settled")
    letters = await dead_letters(pg_pool, pg_schema)
    assert [(x.event_id, x.reason, x.attempts) for x in letters] == [
        ("evt-0-1", "handler_failed", 2)]
    assert "TimeoutError" in letters[0].detail
    async with pg_pool.acquire() as conn:
        assert [r["event_id"] for r in await ledger_rows(conn, pg_schema)] == ["evt-0-2"]
