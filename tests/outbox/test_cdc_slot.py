"""An outbox that deletes each row as it inserts it is only seen through a logical replication
slot's WAL: ``consumerkit migrate --outbox-cdc`` makes the slot and the publication before
the first event, the writer refuses an event while no slot reads the outbox (through
PgBouncer in transaction mode too), and ``consumerkit check`` reports such an outbox. On a
real PostgreSQL with ``wal_level=logical``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
import pytest_asyncio

from consumerkit import migrate
from consumerkit.outbox import NoReplicationSlotError, Outbox, OutboxTable
from consumerkit.outbox.cdc import SlotGuard
from consumerkit.shared.pooler import connect
from tests.harness import LogicalPostgres, start_logical_postgres

from ..cli.test_migrate_check import run
from ..harness.pgbouncer import PgBouncer, start_pgbouncer


@pytest.fixture(scope="module")
def logical_postgres() -> Iterator[LogicalPostgres]:
    with start_logical_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def bouncer(logical_postgres: LogicalPostgres) -> Iterator[PgBouncer]:
    started = start_pgbouncer(logical_postgres.dsn, mode="transaction")
    yield started
    started.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def cdc_table(logical_postgres: LogicalPostgres) -> AsyncIterator[OutboxTable]:
    """A migrated outbox with no slot; its slot and publication dropped afterwards."""
    table = OutboxTable(f"slot_{uuid.uuid4().hex[:8]}", "outbox")
    conn = await asyncpg.connect(logical_postgres.dsn)
    try:
        await migrate(conn, dedup=None, outboxes=[table])
        yield table
        await conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                           "pg_replication_slots WHERE slot_name = $1", table.replication_slot)
        await conn.execute(f'DROP PUBLICATION IF EXISTS "{table.publication}"')
    finally:
        await conn.close()


async def add(conn: asyncpg.Connection[asyncpg.Record], writer: Outbox, n: int) -> None:
    async with conn.transaction():
        await writer.add(conn, event_type="step.done", aggregate_type="step",
                         aggregate_id="k", payload={"n": n})


async def test_the_writer_refuses_until_the_command_made_the_slot(
    logical_postgres: LogicalPostgres, bouncer: PgBouncer, cdc_table: OutboxTable,
    capsys: pytest.CaptureFixture[str],
) -> None:
    writer = Outbox(cdc_table.schema, cdc_table.table, delete_after_insert=True, notify=False)
    conn = await connect(bouncer.dsn, pooler="transaction")
    try:
        with pytest.raises(NoReplicationSlotError) as refused:
            await add(conn, writer, 0)
        message = str(refused.value)
        assert "\n" not in message
        assert f"no replication slot reads outbox {cdc_table.schema}.outbox" in message
        assert ("consumerkit migrate --outbox-only --outbox-cdc --schema "
                f"{cdc_table.schema} --outbox-table outbox") in message

        where = ["--postgres", bouncer.dsn, "--schema", cdc_table.schema]
        code, out = await run(capsys, "migrate", "--outbox-only", "--outbox-cdc", *where)
        assert code == 0, out
        slot = cdc_table.replication_slot
        assert (f"replication slot {slot} (pgoutput) created, publication "
                f"{cdc_table.publication}") in out
        code, out = await run(capsys, "migrate", "--outbox-only", "--outbox-cdc", *where)
        assert f"replication slot {slot} (pgoutput) already present" in out

        for n in range(1, 4):  # the first checks the slot, the next trust it
            await add(conn, writer, n)
    finally:
        await conn.close()

    # every event added is in the slot's WAL; the publication holds the outbox table alone
    direct = await asyncpg.connect(logical_postgres.dsn)
    try:
        inserts = await direct.fetchval(
            "SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL, "
            "'proto_version', '1', 'publication_names', $2) WHERE substr(data, 1, 1) = 'I'",
            slot, cdc_table.publication)
        tables = await direct.fetch("SELECT schemaname, tablename FROM pg_publication_tables "
                                    "WHERE pubname = $1", cdc_table.publication)
    finally:
        await direct.close()
    assert inserts == 3
    assert [tuple(t) for t in tables] == [(cdc_table.schema, "outbox")]


async def test_a_found_slot_is_trusted_for_the_ttl_and_a_missing_one_never(
    logical_postgres: LogicalPostgres, cdc_table: OutboxTable,
) -> None:
    conn = await asyncpg.connect(logical_postgres.dsn)
    try:
        guard = SlotGuard(cdc_table, ttl=3600)
        for _ in range(2):  # a missing slot is asked again at each event
            with pytest.raises(NoReplicationSlotError):
                await guard.check(conn)
        await conn.execute(f'CREATE PUBLICATION "{cdc_table.publication}" '
                           f"FOR TABLE {cdc_table.events}")
        await conn.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                           cdc_table.replication_slot)
        await guard.check(conn)
        await conn.execute("SELECT pg_drop_replication_slot($1)", cdc_table.replication_slot)
        await guard.check(conn)  # trusted: no query until the TTL runs out
        with pytest.raises(NoReplicationSlotError):
            await SlotGuard(cdc_table, ttl=3600).check(conn)
    finally:
        await conn.close()


async def test_a_slot_without_the_outbox_in_a_publication_does_not_read_it(
    logical_postgres: LogicalPostgres, cdc_table: OutboxTable,
) -> None:
    """pgoutput streams only what its reader's publications hold."""
    conn = await asyncpg.connect(logical_postgres.dsn)
    try:
        await conn.execute("SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                           cdc_table.replication_slot)
        with pytest.raises(NoReplicationSlotError):
            await SlotGuard(cdc_table).check(conn)
    finally:
        await conn.close()


async def test_check_reports_a_cdc_outbox_no_slot_reads(
    logical_postgres: LogicalPostgres, cdc_table: OutboxTable,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["check", "--postgres", logical_postgres.dsn, "--schema", cdc_table.schema,
            "--outbox-table", "outbox", "--outbox-cdc"]
    code, out = await run(capsys, *argv)
    assert code == 1
    problem = next(li for li in out.splitlines() if "no replication slot reads" in li)
    assert problem == (
        f"PROBLEM  no replication slot reads outbox {cdc_table.schema}.outbox (change data "
        "capture): events written before its connector first starts are lost; run "
        f"`consumerkit migrate --outbox-only --outbox-cdc --schema {cdc_table.schema} "
        f"--outbox-table outbox` and give the connector slot.name={cdc_table.replication_slot}")

    code, out = await run(capsys, "migrate", "--outbox-only", "--outbox-cdc", "--postgres",
                          logical_postgres.dsn, "--schema", cdc_table.schema)
    assert code == 0, out
    _, out = await run(capsys, *argv)
    assert "no replication slot reads" not in out
    assert (f"ok       outbox {cdc_table.schema}.outbox is read by replication slot "
            f"{cdc_table.replication_slot}") in out


async def test_migrate_makes_the_slot_when_told_a_connector_reads_the_outbox(
    logical_postgres: LogicalPostgres, capsys: pytest.CaptureFixture[str],
) -> None:
    table = OutboxTable(f"slot_{uuid.uuid4().hex[:8]}", "outbox")
    code, out = await run(capsys, "migrate", "--postgres", logical_postgres.dsn,
                          "--schema", table.schema, "--outbox-cdc")
    conn = await asyncpg.connect(logical_postgres.dsn)
    try:
        try:
            assert code == 0, out
            assert (f"replication slot {table.replication_slot} (pgoutput) created, "
                    f"publication {table.publication}") in out
            async with conn.transaction():  # the writer finds it
                await Outbox(table.schema, "outbox", delete_after_insert=True).add(
                    conn, event_type="e", aggregate_type="a", aggregate_id="1", payload={})
        finally:
            await conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                               "pg_replication_slots WHERE slot_name = $1",
                               table.replication_slot)
            await conn.execute(f'DROP PUBLICATION IF EXISTS "{table.publication}"')
    finally:
        await conn.close()
