"""Which layout a dedup table has in the database, read from the catalog.

The catalog is the truth: a policy asking for one layout while the table exists with the other
is refused with a clear error instead of failing halfway through a migration or a maintenance
run (``ATTACH PARTITION`` on a plain table, ``ON CONFLICT`` without a unique key).
"""

from __future__ import annotations

from ..errors import StartupError
from ..shared.identifiers import identifier, qualified
from ..types import DbConnection
from .partitioning import TimePartitioned
from .policy import Layout

_RELKINDS: dict[str, Layout] = {"p": "partitioned", "r": "table"}


async def existing_layout(conn: DbConnection, schema: str, table: str) -> Layout | None:
    """The layout of ``schema.table`` (``None`` if there is no such relation). Raises
    :class:`StartupError` if the name belongs to something else (a view, a sequence)."""
    identifier(schema, "schema name")
    identifier(table, "dedup table name")
    kind: str | None = await conn.fetchval(
        "SELECT c.relkind::text FROM pg_catalog.pg_class c"
        " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = $1 AND c.relname = $2", schema, table)
    if kind is None:
        return None
    if kind not in _RELKINDS:
        raise StartupError(f"{schema}.{table} exists but is not a table (relkind {kind!r})")
    return _RELKINDS[kind]


async def check_layout(conn: DbConnection, schema: str, policy: TimePartitioned) -> Layout | None:
    """The existing layout of the policy's table, after checking it is the policy's own."""
    found = await existing_layout(conn, schema, policy.table)
    if found is not None and found != policy.layout:
        raise StartupError(
            f"table {schema}.{policy.table} exists with the {found!r} layout but the "
            f"settings ask for {policy.layout!r}: the layout of a table cannot be changed in "
            "place; name another table or keep the layout")
    return found


LEAN_ROWS_VERSION: dict[Layout, int] = {"partitioned": 4, "table": 2}
"""The migration step of each layout that converted its table to lean rows."""


async def check_lean_rows(conn: DbConnection, schema: str, policy: TimePartitioned) -> None:
    """Refuse to maintain (and so to start a consumer on) a dedup table that ``migrate`` has
    not converted to lean rows yet: its claim function would get nulls where the earlier one
    needs values. The version table is read, not the catalog, as the runtime role may."""
    version: int | None = await conn.fetchval(
        f"SELECT max(version) FROM {qualified(schema, 'consumerkit_schema_version')}"
        " WHERE component = $1", f"dedup:{policy.table}")
    if version is not None and version < LEAN_ROWS_VERSION[policy.layout]:
        raise StartupError(
            f"dedup table {schema}.{policy.table} is at version {version}, before lean rows: "
            "run consumerkit migrate (docs/dedup.md, migrating to lean rows)")
