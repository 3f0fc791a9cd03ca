"""Least privilege in PostgreSQL: the owner runs ``consumerkit migrate`` and prints the GRANTs;
a role created here (LOGIN, no CREATE anywhere, granted only what was printed plus the
application's own table) runs a consumer through partition creation and expiry, dead letters
and the outbox, the relay, and a signed webhook receiver, and ``permission denied`` appears
nowhere in the logs. It applies the printed GRANTs as docs/security.md tells an operator to
(``consumerkit migrate --print-grants ROLE | psql``)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from consumerkit import (
    Consumer,
    DeadLetterFilter,
    DedupPolicy,
    Postgres,
    RetryPolicy,
    WebhookReceiver,
    WebhookSink,
    discard_dead_letters,
    migrate,
    replay_dead_letters,
)
from consumerkit.dedup.partitions import list_partitions, maintain, partition_floor
from consumerkit.errors import StartupError
from consumerkit.outbox import KafkaSink, Outbox, Relay
from consumerkit.shared.webhook.signature import WebhookSecret, generate_secret, sign_headers
from consumerkit.testing.services import MakeTopic
from tests.webhooks.conftest import serve

from ..brokers import PRODUCER_OPTIONS
from ..pooling import POOLER
from .conftest import LedgerTopic
from .ledger import build, ledger_handler, make_events, publish, publish_raw, read_topic, wait_for
from .worker import emit_billed

ROOT = Path(__file__).resolve().parents[2]
HOUR = timedelta(hours=1)
OWNER_POLICY = DedupPolicy(partition_interval=HOUR, retention=HOUR)  # what the CLI migrates
RUNTIME_POLICY = DedupPolicy(partition_interval=HOUR, retention=HOUR, premake=6)


async def cli(*args: str) -> str:
    """Run ``consumerkit ARGS`` as the owner would; its stdout."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumerkit", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def as_role(dsn: str, role: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{role}@{host}"))


@pytest.fixture
async def role(postgres_dsn: str, pg_pool: asyncpg.Pool) -> AsyncIterator[str]:
    name = f"ck_runtime_{uuid.uuid4().hex[:8]}"
    await pg_pool.execute(f'CREATE ROLE "{name}" LOGIN')
    try:
        yield name
    finally:
        await pg_pool.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", name)
        await pg_pool.execute(f'DROP OWNED BY "{name}"')
        await pg_pool.execute(f'DROP ROLE "{name}"')


async def test_a_role_without_ddl_rights_runs_consumer_relay_and_receiver(
    postgres_dsn: str, kafka_bootstrap: str, ledger_topic: LedgerTopic, make_topic: MakeTopic,
    pg_schema: str, pg_pool: asyncpg.Pool, role: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    topic = await ledger_topic(partitions=2)
    downstream = await make_topic(partitions=1)
    s = f'"{pg_schema}"'
    base = ["--postgres", postgres_dsn, "--schema", pg_schema]
    await cli("migrate", *base, "--interval", "1h", "--retention", "1h")
    async with pg_pool.acquire() as conn:  # partitions of two days ago: expired at start-up
        await maintain(conn, pg_schema, OWNER_POLICY,
                       now=await conn.fetchval("SELECT now() - interval '2 days'"))
        old = {p.name for p in await list_partitions(conn, pg_schema, "processed_events")
               if p.upper is not None and p.upper < await conn.fetchval("SELECT now()")
               - timedelta(days=1)}
    assert old
    grants = (await cli("migrate", *base, "--interval", "1h", "--retention", "1h",
                        "--print-grants", role)).splitlines()
    assert grants
    assert all(g.startswith("GRANT ") for g in grants)
    documented = (ROOT / "docs" / "security.md").read_text()
    for grant in grants:  # the roles table of docs/security.md states each privilege set
        privileges = grant.removeprefix("GRANT ").partition(" ON ")[0]
        assert f"`{privileges}`" in documented, grant
    async with pg_pool.acquire() as conn:
        for statement in grants:
            await conn.execute(statement)
        # the application's own table is the application's to grant
        await conn.execute(f'GRANT SELECT, INSERT ON {s}.ledger TO "{role}"')
        await conn.execute(f'GRANT USAGE ON SEQUENCE {s}.ledger_id_seq TO "{role}"')
        assert not await conn.fetchval("SELECT has_schema_privilege($1, $2, 'CREATE')",
                                       role, pg_schema)
        assert not await conn.fetchval(
            "SELECT has_database_privilege($1, current_database(), 'CREATE')", role)
    dsn = as_role(postgres_dsn, role)

    restricted = await asyncpg.connect(dsn)
    try:  # no DDL of its own, and the owner's functions refuse anything but dedup partitions
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await restricted.execute(f"CREATE TABLE {s}.mine (x int)")
        for table, name in (("ledger", "ledger_p2024010100"),
                            ("processed_events", "processed_events_p1; DROP TABLE x"),
                            ("processed_events", 'x"; DROP TABLE ledger; --')):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await restricted.execute(
                    f"SELECT {s}.consumerkit_create_partition($1, $2, now(), now() + "
                    "interval '1 hour')", table, name)
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await restricted.execute(
                    f"SELECT {s}.consumerkit_drop_partition($1, $2)", table, name)
        assert await restricted.fetchval(f"SELECT count(*) FROM {s}.ledger") == 0
        with pytest.raises(StartupError, match="migrate=False"):  # a clear hint
            await migrate(restricted, pg_schema, OWNER_POLICY)
    finally:
        await restricted.close()

    # the consumer: claims, partitions ahead, expired partitions dropped, outbox, dead letter
    events = make_events(keys=2, per_key=5)
    await publish(kafka_bootstrap, topic, events)
    await publish_raw(kafka_bootstrap, topic, [(b"key-x", b"{not json", [
        ("id", b"broken-1"), ("event_type", b"step.recorded")])])
    consumer: Consumer = build(
        "least-privilege", pg_schema, topic, dsn, kafka_bootstrap, emit_billed,
        migrate=False, dedup=RUNTIME_POLICY, outbox=Outbox(pg_schema),
        offset_store="postgres")  # the offsets beside the effects, under the same grants
    running = asyncio.create_task(consumer.run())
    try:
        async def settled() -> bool:
            done = await pg_pool.fetchval(f"SELECT count(*) FROM {s}.ledger")
            letters = await pg_pool.fetchval(f"SELECT count(*) FROM {s}.dead_letters")
            return bool(done == len(events) and letters == 1)
        await wait_for(settled, 60, "every event applied and one dead letter")
    finally:
        await consumer.stop()
        await asyncio.wait_for(running, 30)
    async with pg_pool.acquire() as conn:
        now = await conn.fetchval("SELECT now()")
        names = {p.name: p for p in await list_partitions(conn, pg_schema, "processed_events")}
    assert not old & set(names), "expired partitions dropped by the runtime role"
    furthest = max(p.lower for p in names.values() if p.lower is not None)
    assert furthest >= partition_floor(now, HOUR) + 6 * HOUR, "partitions made ahead"
    assert await pg_pool.fetchval(f"SELECT count(*) FROM {s}.outbox") == len(events)
    assert await pg_pool.fetchval(  # every record, the dead letter too, below the stored one
        f"SELECT sum(next_offset) FROM {s}.consumer_offsets") == len(events) + 1
    # the dead letter replayed (it fails again: the error is kept beside it), then discarded
    replayed = await replay_dead_letters(consumer)
    assert (replayed.chosen, replayed.failed) == (1, 1)
    restricted = await asyncpg.connect(dsn)
    try:
        dropped = await discard_dead_letters(
            restricted, pg_schema, DeadLetterFilter(consumer=consumer.name), note="bad JSON")
    finally:
        await restricted.close()
    assert len(dropped) == 1
    assert await pg_pool.fetchval(
        f"SELECT resolved_by FROM {s}.dead_letters WHERE status = 'discarded' "
        "AND replay_attempts = 1 AND last_replay_error LIKE 'invalid_json%'") == role

    # the relay: slots (advisory locks), LISTEN, publish, delete, under the same role
    relay = Relay(Postgres(dsn=dsn, schema=pg_schema, pooler=POOLER), KafkaSink(kafka_bootstrap,
        route=downstream,
                                 kafka_options=dict(PRODUCER_OPTIONS)),
                  handle_signals=False, poll_interval=0.2)
    relaying = asyncio.create_task(relay.run())
    try:
        assert len(await read_topic(kafka_bootstrap, downstream, len(events))) == len(events)

        async def emptied() -> bool:
            return bool(await pg_pool.fetchval(f"SELECT count(*) FROM {s}.outbox") == 0)
        await wait_for(emptied, 30, "the relay to delete what it published")
    finally:
        relay.stop()
        await asyncio.wait_for(relaying, 30)

    # a write with a dedup key (the _keys table), then a failing delivery (the _failures table)
    writer = await asyncpg.connect(dsn)
    try:
        async with writer.transaction():
            kept = await Outbox(pg_schema).add(
                writer, event_type="step.billed", aggregate_type="ledger", aggregate_id="k",
                payload={"key": "k"}, dedup_key="once")
        async with writer.transaction():
            assert await Outbox(pg_schema).add(
                writer, event_type="step.billed", aggregate_type="ledger", aggregate_id="k",
                payload={"key": "k"}, dedup_key="once") is None
    finally:
        await writer.close()
    with socket.socket() as closed:  # bound, never listening: every delivery fails
        closed.bind(("127.0.0.1", 0))
        failing = Relay(Postgres(dsn=dsn, schema=pg_schema, pooler=POOLER), WebhookSink(f"http://127.0.0.1:{closed.getsockname()[1]}/x",
                                         timeout=2),
                        handle_signals=False,
                        poll_interval=0.2,
                        retry=RetryPolicy(initial_delay=0.05, max_delay=0.1))
        failing_run = asyncio.create_task(failing.run())
        try:
            async def recorded() -> bool:
                attempts = await pg_pool.fetchval(
                    f"SELECT attempts FROM {s}.outbox_failures WHERE event_id = $1", kept)
                return bool(attempts and attempts >= 2)
            await wait_for(recorded, 30, "two failed attempts recorded by the runtime role")
        finally:
            failing.stop()
            await asyncio.wait_for(failing_run, 30)

    # the webhook receiver, signed, opened without migrating
    secret = generate_secret()
    receiver = WebhookReceiver([ledger_handler(pg_schema)], namespace="least-privilege-hook",
                               postgres=Postgres(dsn=dsn, schema=pg_schema), migrate=False,
                               dedup=RUNTIME_POLICY, secrets=secret)
    body = b'{"key": "hook", "seq": 1}'
    headers = sign_headers([WebhookSecret(secret)], "hook-1", body) | {
        "X-Event-Type": "step.recorded"}
    async with serve(receiver) as url, httpx.AsyncClient(base_url=url) as client:
        first = await client.post("/in", content=body, headers=headers)
        again = await client.post("/in", content=body, headers=headers)
    assert (first.json()["status"], again.json()["status"]) == ("applied", "duplicate")

    assert "permission denied" not in caplog.text.lower()
    assert secret[6:] not in caplog.text
