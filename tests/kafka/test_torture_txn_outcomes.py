"""The torture harness decides, before its drain, the transactional records whose outcome their
writer never recorded (``tests/torture/txn_outcomes.py``): committed ones join the events owed
an effect, aborted ones are marked so. Needs a broker with transactions: Apache Kafka (the
session's, else a single node of its own); skips, saying what to install, without Java."""

from __future__ import annotations

import asyncio

import asyncpg
import orjson

from consumerkit.shared.identifiers import identifier

from ..torture import ledger, txn_outcomes
from .test_transaction_markers import bootstrap, new_topic, transactional

__all__ = ["bootstrap"]  # the module's broker fixture, used here by name


async def _send(producer: object, topic: str, event_id: str, aggregate: str) -> None:
    await producer.send_and_wait(  # type: ignore[attr-defined]
        topic, orjson.dumps({"aggregate": aggregate, "seq": 1}), key=aggregate.encode(),
        headers=[("id", event_id.encode())])


async def test_undecided_records_are_decided_by_what_the_topic_committed(
    bootstrap: str, postgres_dsn: str, pg_schema: str,
) -> None:
    topic = await new_topic(bootstrap, 2)
    conn = await asyncpg.connect(postgres_dsn)
    try:
        await ledger.create(conn, pg_schema, 1)
        s = identifier(pg_schema)
        rows = [("c-1", "open"), ("c-2", "unknown"), ("a-1", "unknown"), ("late-1", "open"),
                ("known-1", "committed")]
        await conn.executemany(
            f"INSERT INTO {s}.txn_events (event_id, aggregate, seq, outcome) "
            "VALUES ($1, $1, 1, $2)", rows)
        async with transactional(bootstrap) as committer, transactional(bootstrap) as aborter, \
                transactional(bootstrap) as late:
            await committer.begin_transaction()
            for event_id in ("c-1", "c-2"):
                await _send(committer, topic, event_id, event_id)
            await committer.commit_transaction()
            await aborter.begin_transaction()
            await _send(aborter, topic, "a-1", "a-1")
            await aborter.abort_transaction()
            # still open when the harness looks: it waits until no transaction is open
            await late.begin_transaction()
            await _send(late, topic, "late-1", "late-1")
            deciding = asyncio.create_task(
                txn_outcomes.settle(conn, bootstrap, pg_schema, topic, 2))
            done, _ = await asyncio.wait([deciding], timeout=2.0)
            assert not done, "the outcomes were decided while a transaction was open"
            await late.commit_transaction()
            counts = await asyncio.wait_for(deciding, 120)
        assert counts == {"committed": 3, "aborted": 1}
        outcomes = {r[0]: r[1] for r in await conn.fetch(
            f"SELECT event_id, outcome FROM {s}.txn_events")}
        assert outcomes == {"c-1": "open_committed", "c-2": "unknown_committed",
                            "a-1": "unknown_aborted", "late-1": "open_committed",
                            "known-1": "committed"}
        owed = {r[0] for r in await conn.fetch(f"SELECT event_id FROM {s}.business")}
        assert owed == {"c-1", "c-2", "late-1"}  # "known-1": its writer adds it itself
        assert await txn_outcomes.settle(conn, bootstrap, pg_schema, topic, 2) == {}
    finally:
        await conn.close()
