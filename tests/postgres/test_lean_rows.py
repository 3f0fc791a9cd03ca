"""Lean dedup rows: ids packed per claim, UUIDs in 16 bytes, names as keys, optional details,
and the migration of a table in the earlier layout (one row per id) with its rows in it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta

import asyncpg
import pytest

from consumerkit import migrate
from consumerkit import schema as schema_module
from consumerkit.dedup import DedupPolicy, Layout, PostgresDedupStore, list_partitions, maintain
from consumerkit.dedup import layout as layout_module
from consumerkit.dedup.ddl_functions import create_partition
from consumerkit.dedup.layout import LEAN_ROWS_VERSION
from consumerkit.dedup.names import key_sql
from consumerkit.dedup.partitions import partition_floor, partition_name
from consumerkit.dedup.upgrade import lean_rows_ddl
from consumerkit.envelope import Envelope
from consumerkit.errors import StartupError
from consumerkit.schema import CORE_STEPS, DEDUP_STEPS, TABLE_DEDUP_STEPS, Step
from consumerkit.types import Claim, ClaimRequest, ClaimStatus

from .conftest import Conn, Connect
from .dedup_rows import count_ids, details, stored

CANONICAL = "0b9f4c2e-6a3d-4f1e-9c8b-7d6e5f4a3b2c"
ODD_IDS = [CANONICAL.upper(), "{" + CANONICAL + "}", CANONICAL.replace("-", "")]


def _envelope(event_id: str, offset: int = 1) -> Envelope:
    return Envelope(event_id=event_id, id_source="header", event_type="order.created",
                    key="k", topic="orders", partition=3, offset=offset, timestamp=None)


async def _claim(store: PostgresDedupStore, conn: Conn, ids: list[str], handler: str = "charge",
                 namespace: str = "billing") -> list[Claim]:
    async with conn.transaction(isolation="read_committed"):
        return await store.claim_many(
            conn, namespace, [ClaimRequest(_envelope(i, n), handler) for n, i in enumerate(ids)])


def _statuses(claims: list[Claim]) -> list[ClaimStatus]:
    return [c.status for c in claims]


# every odd spelling of 36 bytes is one the uuid type reads (upper case); "order-17" never
# reaches the cast; 36 bytes it cannot read send their whole batch down the pattern match
# instead: the ways must agree
@pytest.mark.parametrize("unreadable", [["order-17"], ["order-17", "x" * 36], []],
                         ids=["short", "pattern", "cast"])
async def test_ids_are_compared_as_written_and_only_canonical_uuids_become_uuid(
    conn: Conn, migrated: str, unreadable: list[str],
) -> None:
    store = PostgresDedupStore(migrated)
    ids = [CANONICAL, *ODD_IDS, *unreadable]
    assert _statuses(await _claim(store, conn, ids)) == [ClaimStatus.CLAIMED] * len(ids)
    # each spelling is its own event: a second delivery of each is a duplicate of itself only
    again = await _claim(store, conn, [*ids, CANONICAL.upper().lower()])
    assert _statuses(again) == [ClaimStatus.DUPLICATE] * (len(ids) + 1)
    [row] = await conn.fetch(f'SELECT uuids, texts FROM "{migrated}".processed_events')
    assert row["uuids"] == [uuid.UUID(CANONICAL)]
    assert sorted(row["texts"]) == sorted([*ODD_IDS, *unreadable])
    assert await store.seen(conn, "billing", CANONICAL) is not None
    assert await store.seen(conn, "billing", CANONICAL.upper()) is not None
    assert await store.seen(conn, "billing", str(uuid.uuid4())) is None


async def test_one_row_per_claim_and_handler_with_names_as_keys(
    conn: Conn, migrated: str,
) -> None:
    store = PostgresDedupStore(migrated)
    async with conn.transaction(isolation="read_committed"):
        claims = await store.claim_many(conn, "billing", [
            ClaimRequest(_envelope(f"e-{n}"), "charge" if n % 2 else "refund") for n in range(10)])
    assert _statuses(claims) == [ClaimStatus.CLAIMED] * 10
    await _claim(store, conn, ["e-0"], namespace="audit")  # another namespace: its own id
    rows = await conn.fetch(
        f'SELECT n.name AS namespace, h.name AS handler, cardinality(t.texts) AS ids'
        f' FROM "{migrated}".processed_events t'
        f' JOIN "{migrated}".consumerkit_names n ON n.id = t.namespace_key'
        f' JOIN "{migrated}".consumerkit_names h ON h.id = t.handler_key ORDER BY 1, 2')
    assert [tuple(r) for r in rows] == [
        ("audit", "charge", 1), ("billing", "charge", 5), ("billing", "refund", 5)]
    names = await conn.fetchval(f'SELECT count(*) FROM "{migrated}".consumerkit_names')
    assert names == 4  # billing, audit, charge, refund: each once
    assert await count_ids(conn, migrated, namespace="billing") == 10


@pytest.mark.parametrize("diagnostics", [False, True], ids=["lean", "diagnostics"])
async def test_details_are_stored_only_when_asked_for(
    conn: Conn, migrated: str, diagnostics: bool,
) -> None:
    store = PostgresDedupStore(migrated, DedupPolicy(diagnostics=diagnostics))
    await _claim(store, conn, ["e-1", CANONICAL])
    for event_id, offset in (("e-1", 0), (CANONICAL, 1)):
        [row] = await stored(conn, migrated, event_id)
        if not diagnostics:
            assert row["details"] is None
            continue
        assert details(row) == {"event_type": "order.created", "id_source": "header",
                                "topic": "orders", "partition": 3, "offset": offset,
                                "event_time": None}


def _legacy_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """``migrate`` as it was before lean rows: the same steps, without the last ones."""
    monkeypatch.setattr(schema_module, "CORE_STEPS", CORE_STEPS[:4])
    monkeypatch.setattr(schema_module, "DEDUP_STEPS", DEDUP_STEPS[:3])
    monkeypatch.setattr(schema_module, "TABLE_DEDUP_STEPS", TABLE_DEDUP_STEPS[:1])
    # and its maintenance, which knew no later layout
    monkeypatch.setattr(layout_module, "LEAN_ROWS_VERSION", {"partitioned": 3, "table": 1})


@pytest.mark.parametrize("layout", ["partitioned", "table"])
@pytest.mark.parametrize("diagnostics", [False, True], ids=["lean", "diagnostics"])
async def test_a_table_of_the_earlier_layout_is_migrated_with_its_rows(
    conn: Conn, schema: str, layout: Layout, diagnostics: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = DedupPolicy(layout=layout, diagnostics=diagnostics)
    with monkeypatch.context() as patched:
        _legacy_steps(patched)
        await migrate(conn, schema, policy)
    columns = await conn.fetchval(
        "SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute"
        " WHERE attrelid = $1::regclass AND attnum > 0", f'"{schema}".processed_events')
    assert columns[:3] == ["namespace", "event_id", "seen_at"]  # one row per id
    # rows written by the earlier claim function (it needs every diagnostic column)
    writer = PostgresDedupStore(schema, DedupPolicy(layout=layout, diagnostics=True))
    batch = [CANONICAL, ODD_IDS[0], "order-1", "order-2"]
    await _claim(writer, conn, batch)
    await _claim(writer, conn, ["order-3"], handler="refund", namespace="audit")
    old = {r["event_id"]: r["seen_at"] for r in await conn.fetch(
        f'SELECT event_id, seen_at FROM "{schema}".processed_events')}
    parts_before = [(p.name, p.lower, p.upper)
                    for p in await list_partitions(conn, schema, "processed_events")]

    await migrate(conn, schema, policy)

    store = PostgresDedupStore(schema, policy)
    claims = await _claim(store, conn, [*batch, "order-3", "order-4"])
    assert _statuses(claims) == [ClaimStatus.DUPLICATE] * 4 + [ClaimStatus.CLAIMED] * 2
    assert [c.original_seen_at for c in claims[:4]] == [old[i] for i in batch]
    assert _statuses(await _claim(store, conn, ["order-3"], namespace="audit")) == [
        ClaimStatus.DUPLICATE]
    assert await store.seen(conn, "audit", "order-3") == old["order-3"]
    [row] = [r for r in await stored(conn, schema, "order-3") if r["namespace"] == "audit"]
    assert row["handler"] == "refund"
    assert (row["details"] is not None) is diagnostics
    if diagnostics:
        assert details(row)["topic"] == "orders"
    # one claim call was one row again; the UUID went to 16 bytes
    packed = await conn.fetch(
        f'SELECT uuids, texts FROM "{schema}".processed_events WHERE cardinality(texts) = 3')
    assert [(r["uuids"], sorted(r["texts"])) for r in packed] == [
        ([uuid.UUID(CANONICAL)], sorted([ODD_IDS[0], "order-1", "order-2"]))]
    parts_after = [(p.name, p.lower, p.upper)
                   for p in await list_partitions(conn, schema, "processed_events")]
    assert parts_after == parts_before  # same partitions, same names and bounds
    leftovers = await conn.fetchval(
        "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = $1 AND (c.relname LIKE 'ckold\\_%' OR c.relname LIKE '%\\_old')",
        schema)
    assert leftovers == 0


async def test_migrating_keeps_each_ids_own_time_and_partition(
    conn: Conn, schema: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ids claimed at different times (single claims, an older partition) keep their
    ``seen_at`` and stay in the partition their time belongs to."""
    with monkeypatch.context() as patched:
        _legacy_steps(patched)
        await migrate(conn, schema)
    now: datetime = await conn.fetchval("SELECT now()")
    day = timedelta(days=1)
    for back in (2, 3):  # migrate made the previous day's partition and those after it
        lower = partition_floor(now - back * day, day)
        await create_partition(conn, schema, "processed_events",
                               partition_name("processed_events", lower), lower, lower + day)
    await conn.execute(
        f'INSERT INTO "{schema}".processed_events (namespace, event_id, seen_at, handler,'
        ' id_source, topic, "partition", "offset")'
        " SELECT 'billing', 'e-' || g, $1::timestamptz - g * interval '1 hour', 'charge', 'header',"
        " 'orders', 0, g FROM generate_series(1, 60) AS g", now)
    before = {r["event_id"]: (r["seen_at"], r["tableoid"]) for r in await conn.fetch(
        f'SELECT event_id, seen_at, tableoid::regclass::text FROM "{schema}".processed_events')}
    await migrate(conn, schema)
    after = {r["event_id"]: (r["seen_at"], r["tableoid"]) for r in await conn.fetch(
        f'SELECT v.event_id, v.seen_at, t.tableoid::regclass::text FROM'
        f' "{schema}".processed_events_ids v JOIN "{schema}".processed_events t'
        " ON t.seen_at = v.seen_at")}
    assert after == before
    store = PostgresDedupStore(schema)
    claims = await _claim(store, conn, [f"e-{g}" for g in range(1, 61)])
    assert [c.original_seen_at for c in claims] == [before[f"e-{g}"][0] for g in range(1, 61)]


async def test_a_new_name_makes_no_claim_wait(connect: Connect, migrated: str) -> None:
    """Two lanes of a new consumer claim at once: the second does not wait for the first
    transaction, which registered the name and is still open."""
    first, second = await connect(), await connect()
    store = PostgresDedupStore(migrated)
    tx = first.transaction(isolation="read_committed")
    await tx.start()
    claimed = await store.claim_many(first, "fresh", [ClaimRequest(_envelope("a"), "h")])
    assert _statuses(claimed) == [ClaimStatus.CLAIMED]
    claims = await asyncio.wait_for(_claim(store, second, ["b"], "h", "fresh"), timeout=5)
    assert _statuses(claims) == [ClaimStatus.CLAIMED]
    await tx.commit()
    ids = await second.fetch(
        f'SELECT namespace, event_id, handler FROM "{migrated}".processed_events_ids'
        " ORDER BY event_id")
    assert [tuple(r) for r in ids] == [("fresh", "a", "h"), ("fresh", "b", "h")]


async def test_one_new_name_registered_by_racing_transactions_is_no_collision(
    connect: Connect, migrated: str,
) -> None:
    """Lanes of a new consumer register its names at the same moment, over and over. Decided
    in two statements, one could see another's entry appear between them and refuse the name
    as a collision (about 1 registration in 140 here), failing a claim that did nothing
    wrong."""
    lanes = [await connect() for _ in range(4)]
    function = f'"{migrated}".consumerkit_name_key'
    refused: list[BaseException] = []
    for round_ in range(1500):
        keys = await asyncio.gather(
            *(lane.fetchval(f"SELECT {function}($1)", f"name-{round_}") for lane in lanes),
            return_exceptions=True)
        refused += [k for k in keys if isinstance(k, BaseException)]
    assert refused == []
    names = await lanes[0].fetch(f'SELECT DISTINCT name FROM "{migrated}".consumerkit_names'
                                 " WHERE name LIKE 'name-%'")
    assert len(names) == 1500


async def test_a_name_whose_key_another_name_has_is_refused(conn: Conn, migrated: str) -> None:
    """Two names with one key would share their ids: the second is refused, loudly."""
    billing_key = key_sql("'billing'")
    await conn.execute(f'INSERT INTO "{migrated}".consumerkit_names (id, name)'
                       f" VALUES ({billing_key}, 'not-billing')")
    store = PostgresDedupStore(migrated)
    with pytest.raises(asyncpg.UniqueViolationError, match="has the key of another name"):
        await _claim(store, conn, ["e-1"])


def test_the_lean_rows_step_is_the_one_maintenance_checks_for() -> None:
    layouts: tuple[tuple[Layout, tuple[Step, ...]], ...] = (
        ("partitioned", DEDUP_STEPS), ("table", TABLE_DEDUP_STEPS))
    for layout, steps in layouts:
        [step] = [s for s in steps if s.statements is lean_rows_ddl]
        assert step.version == LEAN_ROWS_VERSION[layout]


@pytest.mark.parametrize("layout", ["partitioned", "table"])
async def test_maintenance_refuses_a_table_not_migrated_to_lean_rows(
    conn: Conn, schema: str, layout: Layout, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A consumer started with migrate=False before the owner migrated: a clear error at
    start-up, not claims failing on the earlier claim function."""
    policy = DedupPolicy(layout=layout)
    with monkeypatch.context() as patched:
        _legacy_steps(patched)
        await migrate(conn, schema, policy)
    with pytest.raises(StartupError, match="before lean rows: run consumerkit migrate"):
        await maintain(conn, schema, policy)
    await migrate(conn, schema, policy)
    await maintain(conn, schema, policy)


async def test_a_row_a_little_ahead_of_the_clock_is_still_found(
    conn: Conn, migrated: str,
) -> None:
    # the claim looks only up to a day past the clock (partitions made ahead are skipped): a
    # row whose seen_at a clock stepped back left in the future still absorbs its duplicate
    store = PostgresDedupStore(migrated)
    ids = [CANONICAL, "order-17"]
    assert _statuses(await _claim(store, conn, ids)) == [ClaimStatus.CLAIMED] * 2
    await conn.execute(f'UPDATE "{migrated}".processed_events '
                       "SET seen_at = now() + interval '20 hours'")
    assert _statuses(await _claim(store, conn, ids)) == [ClaimStatus.DUPLICATE] * 2
