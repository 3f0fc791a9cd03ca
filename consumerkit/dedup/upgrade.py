"""The migration step from one row per event id to lean rows (:mod:`consumerkit.dedup.rows`).

It runs inside ``migrate``'s one transaction, so a failure leaves the table as it was:

1. the old table is renamed ``{table}_old`` (and each old partition ``ckold_<oid>``);
2. the new table is created under the old name, with a partition of the same name and bounds
   for every old one;
3. every namespace and handler name is registered in ``consumerkit_names`` (a name whose
   key another name has fails the migration);
4. the old rows are copied, grouped by (``seen_at``, namespace, handler): the ids one claim
   call stored share their ``seen_at``, so a batch becomes one row again and every id keeps its
   exact ``seen_at``. The diagnostic columns are kept in ``details`` only with
   ``DedupPolicy(diagnostics=True)``;
5. the old table and the old single-id claim function are dropped, then the indexes are built
   over the copied rows (faster than filling indexed tables), the ``{table}_ids`` view and the
   new claim function created. The claim function keeps its parameters, so a process running
   either version keeps working against the table of its own version.

From the rename to the commit the old table is locked ``ACCESS EXCLUSIVE``: claims wait.
"""

from __future__ import annotations

from ..shared.identifiers import identifier, qualified
from .ids import UUID_SQL_PATTERN
from .names import FUNCTION as NAME_KEY
from .names import key_sql
from .policy import DedupPolicy
from .rows import (
    check_dedup_names,
    claim_function,
    claim_many_ddl,
    create_table_ddl,
    index_ddl,
    view_ddl,
)

OLD_CLAIM_SIGNATURES = (
    "text, text, timestamptz, interval, text, text, text, text, integer, bigint",
    "text, text, timestamptz, interval, text, text, text, text, integer, bigint, text",
)
"""Every signature the single-id claim function (``{table}_claim``) ever had."""

_DETAILS = """jsonb_object_agg(o.event_id, jsonb_build_object(
    'event_type', o.event_type, 'id_source', o.id_source, 'topic', o.topic,
    'partition', o."partition", 'offset', o."offset", 'event_time', o.event_time))"""


def lean_rows_ddl(schema: str, policy: DedupPolicy) -> list[str]:
    """The statements converting ``policy.table`` from one row per id to lean rows."""
    check_dedup_names(schema, policy)
    old = f"{policy.table}_old"
    identifier(old, "dedup table name")
    lit = f"'{schema}'"  # validated identifiers: no quote inside
    partitions = ""
    if policy.layout == "partitioned":
        partitions = f"""
    FOR part IN
        SELECT c.oid, c.relname, pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound
          FROM pg_catalog.pg_inherits AS i JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
         WHERE i.inhparent = '{qualified(schema, old)}'::regclass ORDER BY c.relname
    LOOP
        EXECUTE format('ALTER TABLE %I.%I RENAME TO %I', {lit}, part.relname,
                       'ckold_' || part.oid);
        EXECUTE format('CREATE TABLE %I.%I PARTITION OF %I.%I %s', {lit}, part.relname,
                       {lit}, '{policy.table}', part.bound);
    END LOOP;"""
    details = _DETAILS if policy.diagnostics else "NULL::jsonb"
    single = claim_function(schema, policy.table)
    return [
        f"ALTER TABLE {qualified(schema, policy.table)} RENAME TO {identifier(old)}",
        f"""DO $lean$
DECLARE
    part record;
BEGIN
    EXECUTE $create${create_table_ddl(schema, policy)}$create$;{partitions}
END $lean$""",
        f"""SELECT {qualified(schema, NAME_KEY)}(s.name)
              FROM (SELECT DISTINCT v.name FROM {qualified(schema, old)} AS o,
                           LATERAL (VALUES (o.namespace), (o.handler)) AS v(name)) AS s""",
        f"""INSERT INTO {qualified(schema, policy.table)}
                (seen_at, namespace_key, handler_key, uuids, texts, details)
            SELECT o.seen_at, {key_sql("o.namespace")}, {key_sql("o.handler")},
                   array_agg(o.event_id::uuid) FILTER (WHERE o.event_id ~ '{UUID_SQL_PATTERN}'),
                   array_agg(o.event_id) FILTER (WHERE o.event_id !~ '{UUID_SQL_PATTERN}'),
                   {details}
              FROM {qualified(schema, old)} AS o
             GROUP BY o.seen_at, o.namespace, o.handler""",
        f"DROP TABLE {qualified(schema, old)}",
        *(f"DROP FUNCTION IF EXISTS {single}({signature})"
          for signature in OLD_CLAIM_SIGNATURES),
        *index_ddl(schema, policy),
        view_ddl(schema, policy),
        claim_many_ddl(schema, policy),
        f"ANALYZE {qualified(schema, policy.table)}",
    ]
