"""The only DDL a running consumer needs, as functions the owner role creates and owns.

A consumer, relay or webhook receiver may run under a role without CREATE on its schema (see
docs/security.md). Partition maintenance still has to create the dedup partitions ahead and
detach and drop the expired ones, so :func:`consumerkit.migrate` (run by the owner) creates
three ``SECURITY DEFINER`` functions that do exactly that and nothing else:

==================================================  ===========================================
``consumerkit_create_partition(table, name, lo, hi)``  create ``name`` and attach it to ``table``
                                                    for ``[lo, hi)``: ``lo`` must be the UTC
                                                    hour the name carries and ``hi`` at most
                                                    one recorded interval after it
``consumerkit_detach_partition(table, name)``       detach partition ``name`` of ``table`` and
                                                    mark it with the expiry comment
``consumerkit_drop_partition(table, name)``         drop ``name`` if it is a detached partition
                                                    of ``table`` carrying that comment
==================================================  ===========================================

They run with the owner's rights, so each one checks its arguments before any DDL: ``table``
must be a partitioned dedup table or outbox that ``migrate`` recorded in this schema, ``name``
must be ``<table>_pYYYYMMDDHH`` (what :func:`~consumerkit.dedup.partitions.partition_name`
makes), and every identifier reaches the SQL through ``format('%I')``, every value through
``%L``. The bounds are checked too: a partition named for one hour must not cover years, or
expiry (which drops a partition once its upper bound has passed) would never drop it.
``migrate`` records the
dedup table's ``partition_interval`` in ``consumerkit_partition_intervals`` (the owner's; the
runtime role cannot write it), and a range may be no wider than that (narrower is a gap left
after a change of interval, see :func:`~consumerkit.dedup.partitions.uncovered`). Their
``search_path`` is fixed to ``pg_catalog, pg_temp`` so that no object the caller creates (in
``pg_temp``, the only schema it may create in) shadows one they use; every relation they touch
is schema-qualified. ``EXECUTE`` is revoked from ``PUBLIC``: the runtime role gets it from the
GRANTs ``consumerkit migrate --print-grants ROLE`` prints.
"""

from __future__ import annotations

from datetime import timedelta

from ..shared.identifiers import identifier, qualified
from ..types import DbConnection

CREATE = "consumerkit_create_partition"
DETACH = "consumerkit_detach_partition"
DROP = "consumerkit_drop_partition"
FUNCTIONS = (CREATE, DETACH, DROP)
INTERVALS = "consumerkit_partition_intervals"

_CHECK_TABLE = """
    IF NOT EXISTS (
        SELECT 1 FROM pg_catalog.pg_class c
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = @SCHEMA@ AND c.relname = p_table AND c.relkind = 'p')
       OR NOT EXISTS (
        SELECT 1 FROM @VERSIONS@
        WHERE component IN ('dedup:' || p_table, 'outbox:' || p_table)) THEN
        RAISE EXCEPTION 'consumerkit: % is not a partitioned consumerkit table of schema %',
            p_table, @SCHEMA@ USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF p_name IS NULL OR length(p_name) > 63 OR p_name !~ '^[a-z_][a-z0-9_]*_p[0-9]{10}$'
       OR left(p_name, length(p_table) + 2) <> p_table || '_p'
       OR length(p_name) <> length(p_table) + 12 THEN
        RAISE EXCEPTION 'consumerkit: % is not a partition name of %', p_name, p_table
            USING ERRCODE = 'insufficient_privilege';
    END IF;"""


def marker_sql() -> str:
    """The expiry comment (:func:`consumerkit.dedup.expiry.marker`) as an SQL expression."""
    return "'consumerkit: expired partition of ' || p_table || ', detached to be dropped'"


def ddl_functions_ddl(schema: str) -> list[str]:
    """The three functions and their privileges (a core migration step)."""
    identifier(schema, "schema name")
    lit = f"'{schema}'"  # a validated identifier: no quote inside
    check = _CHECK_TABLE.replace("@SCHEMA@", lit).replace(
        "@VERSIONS@", qualified(schema, "consumerkit_schema_version"))
    header = ("LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp "
              "AS $fn$ BEGIN")
    create_header = header.replace(" BEGIN", " DECLARE v_interval interval; BEGIN")
    statements = [
        f"""CREATE TABLE IF NOT EXISTS {qualified(schema, INTERVALS)} (
            dedup_table text PRIMARY KEY,
            partition_interval interval NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now())""",
        f"""CREATE OR REPLACE FUNCTION {qualified(schema, CREATE)}(
            p_table text, p_name text, p_lower timestamptz, p_upper timestamptz)
        RETURNS void {create_header} {check}
            IF p_lower IS NULL OR p_upper IS NULL OR p_lower >= p_upper THEN
                RAISE EXCEPTION 'consumerkit: empty partition range';
            END IF;
            -- the name's digits read as UTC, whatever the session's TimeZone (no DST gap)
            IF p_lower <> make_timestamptz(
                    substr(p_name, length(p_name) - 9, 4)::int,
                    substr(p_name, length(p_name) - 5, 2)::int,
                    substr(p_name, length(p_name) - 3, 2)::int,
                    substr(p_name, length(p_name) - 1, 2)::int, 0, 0, 'UTC') THEN
                RAISE EXCEPTION 'consumerkit: partition % must start at the hour it is named for',
                    p_name USING ERRCODE = 'insufficient_privilege';
            END IF;
            SELECT partition_interval INTO v_interval FROM {qualified(schema, INTERVALS)}
                WHERE dedup_table = p_table;
            -- interval arithmetic counts a day as 24 hours here, whatever the session's TimeZone
            IF v_interval IS NULL OR p_upper - p_lower > v_interval THEN
                RAISE EXCEPTION 'consumerkit: partition % may cover at most % (the interval '
                    'consumerkit migrate recorded for %)', p_name, v_interval, p_table
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
            EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I (LIKE %I.%I INCLUDING DEFAULTS)',
                           {lit}, p_name, {lit}, p_table);
            EXECUTE format('ALTER TABLE %I.%I ATTACH PARTITION %I.%I '
                           'FOR VALUES FROM (%L) TO (%L)',
                           {lit}, p_table, {lit}, p_name, p_lower, p_upper);
        END $fn$""",
        f"""CREATE OR REPLACE FUNCTION {qualified(schema, DETACH)}(p_table text, p_name text)
        RETURNS void {header} {check}
            IF NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_inherits i
                JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
                JOIN pg_catalog.pg_class p ON p.oid = i.inhparent
                JOIN pg_catalog.pg_namespace n ON n.oid = p.relnamespace
                WHERE n.nspname = {lit} AND p.relname = p_table AND c.relname = p_name) THEN
                RAISE EXCEPTION 'consumerkit: % is not a partition of %', p_name, p_table;
            END IF;
            EXECUTE format('ALTER TABLE %I.%I DETACH PARTITION %I.%I',
                           {lit}, p_table, {lit}, p_name);
            EXECUTE format('COMMENT ON TABLE %I.%I IS %L', {lit}, p_name, {marker_sql()});
        END $fn$""",
        f"""CREATE OR REPLACE FUNCTION {qualified(schema, DROP)}(p_table text, p_name text)
        RETURNS boolean {header} {check}
            IF NOT EXISTS (
                SELECT 1 FROM pg_catalog.pg_class c
                JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = {lit} AND c.relname = p_name AND c.relkind = 'r'
                  AND NOT c.relispartition
                  AND pg_catalog.obj_description(c.oid, 'pg_class') = {marker_sql()}) THEN
                RETURN false;
            END IF;
            EXECUTE format('DROP TABLE %I.%I', {lit}, p_name);
            RETURN true;
        END $fn$""",
    ]
    for name, args in ((CREATE, "text, text, timestamptz, timestamptz"),
                       (DETACH, "text, text"), (DROP, "text, text")):
        statements.append(f"REVOKE ALL ON FUNCTION {qualified(schema, name)}({args}) FROM PUBLIC")
    return statements


async def create_partition(conn: DbConnection, schema: str, table: str, name: str,
                           lower: object, upper: object) -> None:
    await conn.execute(f"SELECT {qualified(schema, CREATE)}($1, $2, $3, $4)",
                       table, name, lower, upper)


async def detach_partition(conn: DbConnection, schema: str, table: str, name: str) -> None:
    await conn.execute(f"SELECT {qualified(schema, DETACH)}($1, $2)", table, name)


async def drop_partition(conn: DbConnection, schema: str, table: str, name: str) -> bool:
    dropped: bool = await conn.fetchval(f"SELECT {qualified(schema, DROP)}($1, $2)",
                                        table, name)
    return dropped


async def record_interval(conn: DbConnection, schema: str, table: str,
                          interval: timedelta) -> None:
    """Record ``table``'s partition interval, the widest range the create function allows
    (the owner's ``migrate`` does it, so the runtime role cannot widen it)."""
    await conn.execute(
        f"INSERT INTO {qualified(schema, INTERVALS)} (dedup_table, partition_interval) "
        "VALUES ($1, $2) ON CONFLICT (dedup_table) DO UPDATE SET "
        "partition_interval = EXCLUDED.partition_interval, updated_at = now()",
        table, interval)
