"""The short version against a running consumer (real broker, real PostgreSQL): a generated
batch of hostile records, then good ones. Every good record is applied once, every bad one
applied or dead-lettered with a one-line reason, nothing lost, the consumer still running,
no traceback and no payload value in its text logs."""

from __future__ import annotations

import uuid
from typing import TypeAlias

import asyncpg
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from consumerkit import Consumer, DeadLetterTable, Kafka, Limits, Postgres, RetryPolicy
from consumerkit.deadletter.table import list_dead_letters
from consumerkit.testing.services import MakeTopic

from ..integration.ledger import FAST_GROUP, Running, publish_raw, wait_for
from ..webhooks.handlers import with_search_path
from .handlers import create_items, items_by_event, registry
from .logtext import check_lines, text_logs, unsafe
from .strategies import dumps, event_ids, examples, hostile_bytes, hostile_text, versions

Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
Raw: TypeAlias = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]
MARKER = "PII-7f3a"  # in the rows of records the database refuses: it must stay out of logs
GOOD = 3
SETTLE_TIMEOUT = 90.0


def _typed(event_type: str = "item.saved") -> tuple[str, bytes]:
    return ("event_type", event_type.encode())


def _item(item: str, n: int) -> bytes:
    return dumps({"id": item, "n": n})


def _id(value: str) -> tuple[str, bytes]:
    return ("id", value.encode())


# one strategy per kind of bad record, so the smallest batch still holds every kind
_kinds = st.tuples(
    st.builds(lambda i, v: (b"k1", v, [_id(i), _typed()]), event_ids,
              st.sampled_from([b"{", b"\xff", b"[" * 5000, b"null", b'{"id": 1}'])),
    st.builds(lambda i, t: (b"k2", _item("a", 1), [_id(i), _typed(t)]), event_ids, hostile_text),
    st.builds(lambda i: (b"k3", _item("a", 1), [_id(i), _typed()]), hostile_text),
    st.builds(lambda k, i: (k, _item("a", 1), [_id(i), _typed()]), hostile_bytes, event_ids),
    st.builds(lambda i, v: (b"k5", _item("a", 1), [_id(i), _typed(), ("event_version", v)]),
              event_ids, versions),
    st.builds(lambda i: (b"k6", None, [_id(i), _typed()]), event_ids),
    # refused by the database (CHECK, out of int4 range, a NUL byte), on six keys or more
    st.lists(st.builds(lambda i, item, n: (None, _item(MARKER + item, n), [_id(i), _typed()]),
                       event_ids, hostile_text,
                       st.one_of(st.integers(max_value=-1), st.integers(2**31, 2**63 - 1))),
             min_size=6, max_size=10),
    st.builds(lambda i, item: (b"k8", _item(MARKER + item + "\x00", 1), [_id(i), _typed()]),
              event_ids, hostile_text),
)


def _flatten(kinds: tuple[object, ...]) -> list[Raw]:
    batch: list[Raw] = []
    for kind in kinds:
        batch.extend(kind if isinstance(kind, list) else [kind])  # type: ignore[list-item]
    return batch


@settings(examples(2), phases=[Phase.explicit, Phase.generate])  # each example runs a consumer
@given(bad=_kinds.map(_flatten))
async def test_a_running_consumer_settles_a_hostile_batch_and_applies_every_good_record(
    postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic, pg_schema: str,
    pg_pool: Pool, bad: list[Raw],
) -> None:
    topic = await make_topic(partitions=2)
    schema = f"{pg_schema}_{uuid.uuid4().hex[:6]}"  # one per example: counts start at zero
    await create_items(pg_pool, schema)
    tag = uuid.uuid4().hex[:8]
    # a key of its own for a keyless record, and an id of its own for every record (a
    # hostile id stays hostile: control characters and length are kept)
    bad = [(key if key is not None else f"bad-{i}".encode(), value,
            [(n, v + f"#{i}".encode() if n == "id" else v) for n, v in headers])
           for i, (key, value, headers) in enumerate(bad)]
    good: list[Raw] = [(f"good-{i}".encode(), _item(f"g{i}", i), [_id(f"good-{tag}-{i}"),
                                                                  _typed()])
                       for i in range(GOOD)]
    await publish_raw(kafka_bootstrap, topic, [*bad, *good])
    consumer = Consumer(
        name=f"hostile.{topic}", handlers=[registry], topics=[topic],
        postgres=Postgres(dsn=with_search_path(postgres_dsn, schema), schema=schema),
        kafka=Kafka(bootstrap=kafka_bootstrap, consumer_options=FAST_GROUP),
        limits=Limits(max_message_bytes=64_000),
        handle_signals=False, dead_letter=[DeadLetterTable()],
        retry=RetryPolicy(max_attempts=2, initial_delay=0.01, max_delay=0.05))
    total = len(bad) + GOOD
    try:
        with text_logs("consumerkit") as lines:
            runner = Running(consumer)
            async with runner as running:
                async def settled() -> bool:
                    s = running.stats
                    return bool(s.applied + s.duplicates + s.dead_lettered >= total)

                await wait_for(settled, SETTLE_TIMEOUT, f"all {total} records settled")
                stats = running.stats
                assert runner.task is not None
                assert not runner.task.done(), "the consumer stopped"
        effects = await items_by_event(pg_pool, schema)
        async with pg_pool.acquire() as conn:
            letters = await list_dead_letters(conn, schema, limit=1000)
    finally:
        await pg_pool.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    assert [effects.get(f"good-{tag}-{i}") for i in range(GOOD)] == [1] * GOOD
    assert all(count == 1 for count in effects.values()), effects
    assert stats.applied + stats.duplicates + stats.dead_lettered == total
    assert (sum(effects.values()), len(letters)) == (stats.applied, stats.dead_lettered)
    assert stats.stalls == 0, "rows refused for their values stalled the consumer"
    for letter in letters:
        assert unsafe(letter.detail) is None, f"{letter.reason}: {letter.detail[:300]!r}"
        assert MARKER not in letter.detail, letter.detail[:300]
    check_lines(lines)
    leaked = [line for line in lines if MARKER in line]
    assert not leaked, f"a refused row's values in the log: {leaked[0][:300]!r}"
