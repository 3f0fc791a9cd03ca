"""``consumerkit offsets list | forget`` on a real broker and PostgreSQL: with the offsets in
the database (the default), an offset reset made as Kafka's tool makes it is not read while
a row is stored; forgetting the rows of the stopped consumer lets it take effect, and
forgetting is refused while the group has a member."""

from __future__ import annotations

from pathlib import Path

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition

from ..cli.conftest import cli
from .conftest import LedgerTopic
from .ledger import FAST_GROUP, Event, Running, build, make_events, publish, verify, wait_for
from .test_offset_store import _at_least, _settled, committed, rows, stored

PARTITIONS = 2


async def reset_to_start(bootstrap: str, group: str, topic: str) -> None:
    """The group's committed offsets set to 0, as ``kafka-consumer-groups --reset-offsets
    --to-earliest --execute`` does. Tansu refuses commits from outside a generation, so a
    member of the group commits them (the group is otherwise empty, as for Kafka's tool)."""
    parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    client = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                              enable_auto_commit=False, **FAST_GROUP)
    await client.start()
    try:
        async def assigned() -> bool:
            await client.getmany(timeout_ms=100)
            return set(client.assignment()) == set(parts)

        await wait_for(assigned, 60, "the resetting member's assignment")
        await client.commit(dict.fromkeys(parts, 0))
    finally:
        await client.stop()


async def test_a_reset_takes_effect_once_the_stopped_consumers_rows_are_forgotten(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, pg_schema: str,
    pg_pool: asyncpg.Pool, tmp_path: Path,
) -> None:
    topic = await ledger_topic(partitions=PARTITIONS)
    events = make_events(keys=6, per_key=5)
    await publish(kafka_bootstrap, topic, events)
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    first = build("forget", pg_schema, topic, postgres_dsn, kafka_bootstrap)
    assert first.offset_store == "postgres"  # the default
    name = first.name
    async with Running(first):
        await wait_for(lambda: _at_least(pg_pool, pg_schema, len(events)), 120, "every effect")
        await wait_for(lambda: _settled(first, len(events)), 60, "every record settled")

    async def committed_all() -> bool:
        found = await committed(kafka_bootstrap, name, topic, PARTITIONS)
        return sum(found.values()) == len(events)

    await wait_for(committed_all, 60, "the offsets committed to Kafka")
    listed = await cli("offsets", "list", "--consumer", name, *db, cwd=tmp_path)
    assert listed.code == 0, listed.err
    in_database = await stored(pg_pool, pg_schema, name)
    assert all(line.startswith(f"{name} {topic}/") for line in listed.out.splitlines()[:-1])
    for partition, offset in in_database.items():
        assert f"{name} {topic}/{partition}: next offset {offset} (" in listed.out
    assert listed.out.splitlines()[-1] == f"{PARTITIONS} stored offsets"

    # Kafka's reset alone: the stored rows win, nothing is read again
    await reset_to_start(kafka_bootstrap, name, topic)
    extra = [Event("extra-1", "key-extra", 1)]
    second = build("forget", pg_schema, topic, postgres_dsn, kafka_bootstrap)
    async with Running(second):
        await publish(kafka_bootstrap, topic, extra)
        await wait_for(lambda: _settled(second, 1), 120, "the new record")
        assert second.stats.delivered == 1
        refused = await cli("offsets", "forget", "--consumer", name, "--kafka",
                            kafka_bootstrap, *db, cwd=tmp_path)
        assert refused.code != 0
        assert f"consumer group {name!r} has 1 member(s): stop its consumers first" in (
            refused.err), refused.err
        assert "Traceback" not in refused.err
        assert await stored(pg_pool, pg_schema, name)  # kept

    # reset, then forget: read again from the start, every record a duplicate
    await reset_to_start(kafka_bootstrap, name, topic)
    in_database = await stored(pg_pool, pg_schema, name)
    forgot = await cli("offsets", "forget", "--consumer", name, "--kafka", kafka_bootstrap,
                       *db, cwd=tmp_path)
    assert forgot.code == 0, forgot.err
    assert forgot.out.splitlines()[-1] == f"{PARTITIONS} stored offsets forgotten"
    for partition, offset in in_database.items():
        assert (f"forgot {name} {topic}/{partition} (was at {offset}): resumes from Kafka's "
                "committed offset 0") in forgot.out
    assert await stored(pg_pool, pg_schema, name) == {}
    third = build("forget", pg_schema, topic, postgres_dsn, kafka_bootstrap)
    total = len(events) + len(extra)
    async with Running(third):
        await wait_for(lambda: _settled(third, total), 120, "every record read again")
    assert third.stats.duplicates == total
    verify(await rows(pg_pool, pg_schema), events + extra)
    assert sum((await stored(pg_pool, pg_schema, name)).values()) == total


async def test_forget_says_what_it_needs_in_one_line(
    postgres_dsn: str, pg_schema: str, tmp_path: Path,
) -> None:
    db = ["--postgres", postgres_dsn, "--schema", pg_schema]
    no_topic = await cli("offsets", "forget", "--consumer", "billing", "--partition", "0",
                         "--kafka", "127.0.0.1:9", *db, cwd=tmp_path)
    assert no_topic.code != 0
    assert no_topic.err.strip().endswith("--partition needs --topic")
    bad = await cli("offsets", "forget", "--consumer", "bad name!", "--kafka", "127.0.0.1:9",
                    *db, cwd=tmp_path)
    assert bad.code != 0
    assert "consumer name" in bad.err
    assert "Traceback" not in bad.err
    unreachable = await cli("offsets", "forget", "--consumer", "billing", "--kafka",
                            "127.0.0.1:9", *db, cwd=tmp_path)
    assert unreachable.code != 0
    assert "cannot describe consumer group 'billing' on 127.0.0.1:9" in unreachable.err
    assert "Traceback" not in unreachable.err
    unmigrated = await cli("offsets", "list", *db, cwd=tmp_path)
    assert unmigrated.code != 0
    assert "Traceback" not in unmigrated.err
    assert "consumer_offsets" in unmigrated.err
    assert "consumerkit migrate" in unmigrated.err
