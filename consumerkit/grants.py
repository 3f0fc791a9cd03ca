"""The GRANTs a runtime role needs, read from what ``migrate`` created in a schema.

The owner role runs ``consumerkit migrate`` (with ``--outbox-table``): it creates the
schema, the tables and the partition maintenance functions. Consumers, relays and webhook
receivers then run under a role that owns nothing and may create nothing in the schema
(``migrate=False``); :func:`runtime_grants` lists what that role needs, table by table:

====================================  ===============================================
``consumerkit_schema_version``        SELECT (layout checks)
``consumerkit_retention``             SELECT, INSERT, UPDATE (retention registry)
``dead_letters``                      SELECT, INSERT, UPDATE (a replay or discard marks them)
``consumerkit_names``                 SELECT, INSERT (namespace and handler keys)
``consumer_offsets``                  SELECT, INSERT, UPDATE (``offset_store="postgres"``,
                                      the default)
``parked_keys``, ``parked_records``   SELECT, INSERT, UPDATE, DELETE (parking; replay
                                      and discard remove what they unpark)
``parked_audit``                      SELECT, INSERT (who replayed or discarded a key)
each dedup table                      SELECT, INSERT, UPDATE, DELETE (claims; the
                                      table layout's cleanup deletes)
its ``_guard`` table                  SELECT, INSERT, DELETE (the claim's wait)
each outbox table                     SELECT, INSERT, DELETE (write; relay deletes)
its ``_failures`` side table          SELECT, INSERT, UPDATE, DELETE (relay state)
its ``_leases``, ``_relays``          SELECT, INSERT, UPDATE, DELETE (relay leases)
its ``_keys`` side table              SELECT, INSERT, DELETE (idempotency keys)
their sequences                       USAGE, SELECT
consumerkit's functions               EXECUTE (each dedup table's claim functions,
                                      name keys, partition maintenance)
====================================  ===============================================

Partitions need no grant: claims go through the parent, and new partitions are created by
the owner's ``SECURITY DEFINER`` functions (:mod:`consumerkit.dedup.ddl_functions`). Advisory
locks, LISTEN and NOTIFY need no privilege. Tables of the application (what handlers write)
are the application's to grant, and so are functions of its own in a shared schema: they are
named nowhere here.
"""

from __future__ import annotations

import re

from .deadletter.table import TABLE as DEAD_LETTERS
from .dedup.ddl_functions import FUNCTIONS
from .dedup.names import FUNCTION as NAME_KEY
from .dedup.names import TABLE as NAMES
from .dedup.retention import TABLE as RETENTION
from .errors import ConfigurationError
from .offsets.postgres import TABLE as OFFSETS
from .parking.tables import AUDIT as PARKED_AUDIT
from .parking.tables import COMPONENT as PARKING
from .parking.tables import KEYS as PARKED_KEYS
from .parking.tables import RECORDS as PARKED_RECORDS
from .schema import VERSION_TABLE, applied_versions
from .shared.identifiers import identifier, qualified
from .types import DbConnection

_ROLE = re.compile(r"[A-Za-z_][A-Za-z0-9_$-]{0,62}")

_SEQUENCES = """
SELECT s.relname AS sequence, t.relname AS owner_table
FROM pg_catalog.pg_class s
JOIN pg_catalog.pg_namespace n ON n.oid = s.relnamespace
JOIN pg_catalog.pg_depend d ON d.objid = s.oid AND d.deptype = 'a'
JOIN pg_catalog.pg_class t ON t.oid = d.refobjid
WHERE n.nspname = $1 AND s.relkind = 'S'
ORDER BY s.relname
"""

_FUNCTIONS = """
SELECT p.proname AS name, pg_catalog.pg_get_function_identity_arguments(p.oid) AS args
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = $1 AND p.proname = ANY($2::text[]) ORDER BY 1, 2
"""


def role_name(role: str) -> str:
    """``role`` double-quoted, after checking it is a plain role name."""
    if not isinstance(role, str) or not _ROLE.fullmatch(role):
        raise ConfigurationError(
            f"invalid role name {role!r}: use 1-63 letters, digits, _, $ or -")
    return f'"{role}"'


async def runtime_grants(conn: DbConnection, schema: str, role: str) -> list[str]:
    """The GRANT statements that let ``role`` run consumers, relays and webhook receivers on
    ``schema`` as migrated now (run :func:`consumerkit.migrate` and every outbox's migration
    first). Raises :class:`ConfigurationError` if ``schema`` was never migrated."""
    grantee = role_name(role)
    identifier(schema, "schema name")
    components = await applied_versions(conn, schema)
    if not components:
        raise ConfigurationError(f"schema {schema} is not migrated: run consumerkit migrate")
    tables: dict[str, str] = {VERSION_TABLE: "SELECT"}
    if "core" in components:  # absent when only outboxes were migrated (--outbox-only)
        tables |= {RETENTION: "SELECT, INSERT, UPDATE", DEAD_LETTERS: "SELECT, INSERT, UPDATE",
                   NAMES: "SELECT, INSERT", OFFSETS: "SELECT, INSERT, UPDATE"}
    functions = [*FUNCTIONS, NAME_KEY]
    for component in components:
        kind, _, name = component.partition(":")
        if kind == "dedup":
            tables[name] = "SELECT, INSERT, UPDATE, DELETE"
            if await conn.fetchval("SELECT to_regclass($1)", f"{schema}.{name}_guard"):
                tables[f"{name}_guard"] = "SELECT, INSERT, DELETE"
            functions += [f"{name}_claim", f"{name}_claim_many"]
        elif kind == PARKING:
            tables[PARKED_KEYS] = tables[PARKED_RECORDS] = "SELECT, INSERT, UPDATE, DELETE"
            tables[PARKED_AUDIT] = "SELECT, INSERT"
        elif kind == "outbox":
            tables[name] = "SELECT, INSERT, DELETE"
            tables[f"{name}_failures"] = "SELECT, INSERT, UPDATE, DELETE"
            tables[f"{name}_leases"] = "SELECT, INSERT, UPDATE, DELETE"
            tables[f"{name}_relays"] = "SELECT, INSERT, UPDATE, DELETE"
            tables[f"{name}_keys"] = "SELECT, INSERT, DELETE"
    statements = [f"GRANT USAGE ON SCHEMA {identifier(schema)} TO {grantee};"]
    statements += [f"GRANT {privileges} ON TABLE {qualified(schema, table)} TO {grantee};"
                   for table, privileges in tables.items()]
    statements += [
        f"GRANT USAGE, SELECT ON SEQUENCE {qualified(schema, row['sequence'])} TO {grantee};"
        for row in await conn.fetch(_SEQUENCES, schema) if row["owner_table"] in tables]
    # consumerkit's functions by name, not every function of a schema that may be shared
    statements += [f"GRANT EXECUTE ON FUNCTION {qualified(schema, row['name'])}({row['args']}) "
                   f"TO {grantee};" for row in await conn.fetch(_FUNCTIONS, schema, functions)]
    return statements
