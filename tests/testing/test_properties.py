"""A property, through the whole consumer: whatever mix of duplicates, redeliveries and
replays reaches it, each event's effect happens once, and each key's effects in the order the
events were published."""

from __future__ import annotations

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumerkit import Limits, Postgres
from consumerkit.testing import TestConsumer

from .handlers import TABLE_SQL, Step, registry

# (key, action): publish a new event of the key, redeliver one published event, or replay the
# group from the start
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("publish"), st.sampled_from("abcde")),
    st.tuples(st.just("redeliver"), st.integers(0, 1000)),
    st.tuples(st.just("replay"), st.just("")),
), min_size=1, max_size=40)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=ACTIONS, max_batch=st.sampled_from([1, 500]))
async def test_each_effect_once_in_key_order(
    consumerkit_dsn: str, consumerkit_schema: str, actions: list[tuple[str, str | int]],
    max_batch: int,
) -> None:
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute("DROP TABLE IF EXISTS effects")
        await conn.execute(TABLE_SQL)
        # event ids are new in every example: the dedup rows of earlier ones change nothing
        async with TestConsumer([registry],
                                postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                                limits=Limits(max_batch=max_batch)) as kit:
            published, seqs = [], dict.fromkeys("abcde", 0)
            for action, arg in actions:
                if action == "publish":
                    key = str(arg)
                    published.append(kit.publish(Step(key=key, seq=seqs[key]), key=key))
                    seqs[key] += 1
                elif action == "redeliver" and published:
                    kit.redeliver(published[int(arg) % len(published)])
                elif action == "replay":
                    await kit.drain()
                    kit.replay(0)
            await kit.drain()
        rows = await conn.fetch("SELECT key, seq FROM effects ORDER BY id")
    finally:
        await conn.close()
    for key, count in seqs.items():
        assert [r["seq"] for r in rows if r["key"] == key] == list(range(count))
    assert len(kit.applied) == len(published)
