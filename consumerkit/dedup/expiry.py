"""Expired partitions leave the dedup table in two steps: detached, then dropped.

Dropping a partition needs ``ACCESS EXCLUSIVE`` on the parent until the dropping transaction
ends, and the end of that transaction is where PostgreSQL gives the partition's files back to
the file system. That costs time in proportion to the partition's size (on the disks where
consumerkit is benchmarked, about 0.2 ms per MB: a quarter of a second for a 700 MB day), and
every claim of every consumer of the table queues behind it. So maintenance detaches expired
partitions inside its own short transaction (catalog changes only: the parent is locked for
milliseconds) and marks each with a comment; then :func:`drop_detached` drops every marked
table in a transaction of its own, which locks nothing a consumer uses.

A run interrupted between the two steps leaves marked tables behind: they hold only expired
rows, no claim reads them, and the next run drops them. Only tables carrying the marker of
this dedup table are ever dropped here. Detaching, marking and dropping go through functions
the owner role created (:mod:`~consumerkit.dedup.ddl_functions`), so this works under a
runtime role without DDL rights.
"""

from __future__ import annotations

import asyncpg

from ..types import DbConnection
from .ddl_functions import detach_partition, drop_partition

_MARKED = """
SELECT c.relname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'r' AND NOT c.relispartition
  AND pg_catalog.obj_description(c.oid, 'pg_class') = $2
  AND ($3::text IS NULL OR c.relname = $3)
ORDER BY c.relname
"""


async def is_marked(conn: DbConnection, schema: str, table: str, name: str) -> bool:
    """Whether ``schema.name`` is a detached, marked partition of dedup table ``table``."""
    return bool(await conn.fetch(_MARKED, schema, marker(table), name))


def marker(table: str) -> str:
    """The comment that marks a detached, expired partition of dedup table ``table``."""
    return f"consumerkit: expired partition of {table}, detached to be dropped"


async def detach(conn: DbConnection, schema: str, table: str, name: str) -> bool:
    """Detach partition ``name`` of ``schema.table`` and mark it, in a savepoint of the
    caller's transaction; ``False`` if the parent's lock was not granted within the
    transaction's ``lock_timeout`` (nothing changed then)."""
    try:
        async with conn.transaction():  # the owner's function marks it with marker(table)
            await detach_partition(conn, schema, table, name)
    except asyncpg.LockNotAvailableError:
        return False
    return True


async def drop_detached(
    conn: DbConnection, schema: str, table: str, *, lock_key: str, lock_seed: int,
    lock_timeout: str,
) -> tuple[list[str], list[str]]:
    """Drop every marked table of ``schema.table``, each in its own transaction under the
    maintainers' advisory lock ``lock_key`` (so two maintainers never both report one).
    Returns the names dropped and those left for the next run because a lock was not granted
    within ``lock_timeout`` (a PostgreSQL interval, e.g. ``"2000ms"``)."""
    dropped: list[str] = []
    deferred: list[str] = []
    for row in await conn.fetch(_MARKED, schema, marker(table), None):
        name: str = row["relname"]
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, $2)),"
                    " set_config('lock_timeout', $3, true)", lock_key, lock_seed, lock_timeout)
                # still there, detached and marked: a maintainer may have dropped it, or
                # (after a change of partition_interval) adopted its name for a new one
                if await drop_partition(conn, schema, table, name):
                    dropped.append(name)
        except asyncpg.LockNotAvailableError:
            deferred.append(name)
    return dropped, deferred
