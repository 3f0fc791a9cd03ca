"""Time partitions of the dedup table: create them ahead, drop them whole once expired.

The dedup table is range-partitioned on ``seen_at`` (the database time of the first delivery),
so retention costs one ``DROP TABLE`` per partition instead of a ``DELETE`` that bloats the
table and fights the consumers for locks. Partition bounds are UTC multiples of
``DedupPolicy.partition_interval`` counted from the Unix epoch, so every process computes the
same bounds whatever its time zone, and the clock that decides is the database's, the same one
that stamped ``seen_at``.

Locking, since maintenance runs while consumers claim:

* an advisory lock per dedup table serializes maintainers, so every consumer process may run
  :func:`maintain` on its own schedule;
* a new partition is created as a plain table and then attached: ``ATTACH PARTITION`` takes
  only a ``SHARE UPDATE EXCLUSIVE`` lock on the parent, which does not block claims, whereas
  ``CREATE TABLE ... PARTITION OF`` would take ``ACCESS EXCLUSIVE``;
* an expired partition is detached (``ACCESS EXCLUSIVE`` on the parent, for a catalog change)
  and dropped afterwards, in a transaction that holds no lock a claim needs: see
  :mod:`~consumerkit.dedup.expiry`. While a detach waits for its lock every new claim queues
  behind it; ``lock_timeout`` bounds that stall, and detaches that cannot get the lock in time
  are rolled back to a savepoint, reported as ``deferred`` and retried next run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from ..errors import ConfigurationError, StartupError
from ..shared.identifiers import identifier, qualified
from ..types import DbConnection
from .cleanup import clean_table
from .ddl_functions import create_partition, drop_partition
from .expiry import detach, drop_detached, is_marked
from .layout import check_layout, check_lean_rows, existing_layout
from .partitioning import TimePartitioned
from .policy import DedupPolicy
from .retention import longest, register

LOCK_SEED = 0x636B_6974
"""Seed ("ckit") of ``hashtextextended`` for consumerkit's advisory-lock keys, so they do not
collide with keys an application derives from the same text with the default seed."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_PARTITIONS_SQL = """
SELECT c.relname AS name,
       (regexp_match(b.bound, 'FROM \\(''([^'']*)''\\)'))[1]::timestamptz AS lower,
       (regexp_match(b.bound, 'TO \\(''([^'']*)''\\)'))[1]::timestamptz AS upper,
       c.reltuples::bigint AS approx_rows,
       pg_total_relation_size(c.oid) AS size_bytes
FROM pg_catalog.pg_inherits i
JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
JOIN pg_catalog.pg_class p ON p.oid = i.inhparent
JOIN pg_catalog.pg_namespace n ON n.oid = p.relnamespace
CROSS JOIN LATERAL (SELECT pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound) b
WHERE n.nspname = $1 AND p.relname = $2
ORDER BY lower NULLS FIRST, c.relname
"""
# The bounds are cast back from the text pg_get_expr prints, in the same session, so the
# session's TimeZone and DateStyle round-trip exactly; no Python-side date parsing.

_COUNT_SQL = """SELECT count(*) AS rows, coalesce(sum(
    coalesce(cardinality(uuids), 0) + coalesce(cardinality(texts), 0)), 0)::bigint AS ids
    FROM {}"""

_TABLE_SQL = """
SELECT c.relname AS name, NULL::timestamptz AS lower, NULL::timestamptz AS upper,
       c.reltuples::bigint AS approx_rows, pg_total_relation_size(c.oid) AS size_bytes
FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2
"""


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition of a dedup table, as the catalog describes it.

    ``lower``/``upper`` are ``None`` for an unbounded side (``MINVALUE``/``MAXVALUE``) or a
    default partition. ``approx_rows`` is the planner's estimate (``None`` before the first
    ``ANALYZE``), cheap enough for telemetry on large tables. A row holds the ids of one claim
    call; ``ids`` counts the event ids themselves, only when listed with ``exact``.
    """

    name: str
    lower: datetime | None
    upper: datetime | None
    approx_rows: int | None
    size_bytes: int
    ids: int | None = None


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    """What one :func:`maintain` run changed: partitions created and dropped, and the expired
    partitions whose drop was deferred because the table lock was not granted in time. For the
    ``"table"`` layout: ``deleted`` rows, and ``deferred`` names the table when a batch gave up
    on a lock before the cleanup was done."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)
    deleted: int = 0


def partition_name(table: str, lower: datetime) -> str:
    """``{table}_pYYYYMMDDHH`` from the partition's UTC lower bound: sortable and unique,
    since every bound is a whole UTC hour."""
    return f"{table}_p{lower.astimezone(UTC):%Y%m%d%H}"


def check_partition_names(table: str) -> None:
    """Fail early when ``table`` is too long for its partition names (63 characters)."""
    identifier(partition_name(table, _EPOCH), "dedup partition name")


def partition_floor(moment: datetime, step: timedelta) -> datetime:
    """The lower bound of the partition containing ``moment``."""
    if moment.tzinfo is None:
        raise ConfigurationError("maintenance time must be timezone-aware")
    return _EPOCH + ((moment - _EPOCH) // step) * step


def wanted_ranges(now: datetime, policy: TimePartitioned) -> list[tuple[datetime, datetime]]:
    """The ranges that must exist: the previous partition (a transaction that began before a
    boundary stamps ``seen_at`` with its start time), the current one and ``premake`` ahead."""
    step = policy.partition_interval
    first = partition_floor(now, step) - step
    return [(first + k * step, first + (k + 1) * step) for k in range(policy.premake + 2)]


def uncovered(
    lo: datetime, hi: datetime, existing: list[PartitionInfo],
) -> list[tuple[datetime, datetime]]:
    """The parts of ``[lo, hi)`` no existing partition covers. After a change of
    ``partition_interval`` old and new bounds differ; filling only the gaps keeps the table
    covered without overlapping an existing partition (which PostgreSQL would refuse)."""
    gaps = [(lo, hi)]
    for part in existing:
        if part.lower is None and part.upper is None:
            continue  # a DEFAULT partition (never made by consumerkit) covers no fixed range
        p_lo = part.lower or datetime.min.replace(tzinfo=UTC)
        p_hi = part.upper or datetime.max.replace(tzinfo=UTC)
        next_gaps: list[tuple[datetime, datetime]] = []
        for g_lo, g_hi in gaps:
            if p_hi <= g_lo or p_lo >= g_hi:
                next_gaps.append((g_lo, g_hi))
                continue
            if g_lo < p_lo:
                next_gaps.append((g_lo, p_lo))
            if p_hi < g_hi:
                next_gaps.append((p_hi, g_hi))
        gaps = next_gaps
    return gaps


async def list_partitions(
    conn: DbConnection, schema: str, table: str, *, exact: bool = False,
) -> list[PartitionInfo]:
    """The partitions of ``schema.table`` in bound order, read from ``pg_catalog``; for a
    table of the ``"table"`` layout, the table itself as one unbounded entry. Row counts are
    the planner's estimates, or counted per partition with ``exact`` (a full scan), which also
    counts the event ids the rows hold (``ids``)."""
    identifier(schema, "schema name")
    identifier(table, "dedup table name")
    if await existing_layout(conn, schema, table) == "table":
        rows = await conn.fetch(_TABLE_SQL, schema, table)
    else:
        rows = await conn.fetch(_PARTITIONS_SQL, schema, table)
    parts = [
        PartitionInfo(
            name=row["name"], lower=row["lower"], upper=row["upper"],
            approx_rows=row["approx_rows"] if row["approx_rows"] >= 0 else None,
            size_bytes=row["size_bytes"],
        )
        for row in rows
    ]
    if exact:
        counted = [await conn.fetchrow(_COUNT_SQL.format(qualified(schema, p.name)))
                   for p in parts]
        parts = [dataclasses.replace(p, approx_rows=c["rows"], ids=c["ids"])
                 for p, c in zip(parts, counted, strict=True) if c is not None]
    return parts


async def maintain(
    conn: DbConnection, schema: str, policy: TimePartitioned, *, now: datetime | None = None,
    namespace: str | None = None, lock_timeout: timedelta = timedelta(seconds=2),
) -> MaintenanceReport:
    """Create the partitions the next ``premake`` intervals need and drop expired ones; for
    the ``"table"`` layout, delete the expired rows in batches instead (see
    :mod:`~consumerkit.dedup.cleanup`: short transactions of their own, so call it outside a
    transaction).

    A partition is dropped when its upper bound is at or before
    ``now - (retention + policy.clock_skew)``, where ``retention`` is the longest of
    ``policy.retention`` and every retention registered for the table
    (:mod:`~consumerkit.dedup.retention`); ``namespace``, if given, first registers
    ``policy.retention`` for itself. The skew margin keeps a row until a redelivery stamped by
    a fast producer clock counts as expired (see :class:`DedupPolicy`). ``now`` defaults to
    the database's ``now()``; tests pass a time. Creating partitions and detaching expired
    ones is one transaction, so a failure there leaves the table as it was; each detached
    partition is then dropped in a transaction of its own (:mod:`~consumerkit.dedup.expiry`),
    so call it outside a transaction for the parent's lock to be short. Raises
    :class:`StartupError` if the table is missing or has the other layout.
    """
    if policy.layout == "table":
        if not isinstance(policy, DedupPolicy):
            raise ConfigurationError(f"{policy.table}: only a dedup table has the table layout")
        cleanup = await clean_table(conn, schema, policy, now=now, namespace=namespace,
                                    lock_seed=LOCK_SEED, lock_timeout=lock_timeout)
        return MaintenanceReport(
            deferred=[] if cleanup.finished else [policy.table], deleted=cleanup.deleted)
    check_partition_names(policy.table)
    if now is not None and now.tzinfo is None:
        raise ConfigurationError("maintenance time must be timezone-aware")
    created: list[str] = []
    deferred: list[str] = []
    lock_key = f"consumerkit.maintain\x1f{schema}.{policy.table}"
    # (0 would mean "no timeout": at least 1 ms)
    timeout = f"{max(1, int(lock_timeout.total_seconds() * 1000))}ms"
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))",
                           lock_key, LOCK_SEED)
        # Set after the advisory lock: lock_timeout applies to advisory locks too, and waiting
        # for another maintainer is harmless.
        await conn.execute("SELECT set_config('lock_timeout', $1, true)", timeout)
        if await check_layout(conn, schema, policy) is None:
            raise StartupError(f"table {schema}.{policy.table} does not exist: run migrate")
        await check_lean_rows(conn, schema, policy)
        moment: datetime = now if now is not None else await conn.fetchval("SELECT now()")
        existing = await list_partitions(conn, schema, policy.table)
        for lo, hi in wanted_ranges(moment, policy):
            for gap_lo, gap_hi in uncovered(lo, hi, existing):
                name = partition_name(policy.table, gap_lo)
                if await is_marked(conn, schema, policy.table, name):
                    # a detached leftover holding expired rows, whose name a new range takes
                    # after a change of partition_interval: never adopt it
                    await drop_partition(conn, schema, policy.table, name)
                # through the owner's function: the runtime role may lack CREATE
                await create_partition(conn, schema, policy.table, name, gap_lo, gap_hi)
                created.append(name)
        if namespace is not None:
            await register(conn, schema, policy.table, namespace, policy.retention)
        retention = max(policy.retention,
                        await longest(conn, schema, policy.table) or policy.retention)
        horizon = moment - (retention + policy.clock_skew)
        for part in existing:
            if part.upper is None or part.upper > horizon:
                continue
            # After one lock timeout, defer the rest: consumers queue behind every attempt.
            if deferred or not await detach(conn, schema, policy.table, part.name):
                deferred.append(part.name)
    dropped, left = await drop_detached(conn, schema, policy.table, lock_key=lock_key,
                                        lock_seed=LOCK_SEED, lock_timeout=timeout)
    return MaintenanceReport(created, dropped, deferred + left)

