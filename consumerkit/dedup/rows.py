"""The dedup rows, in both layouts: one row per claim call and handler, not one per event.

A row holds the ids one ``{table}_claim_many`` call claimed for one handler, so the 24 bytes
of a PostgreSQL row header, the ``seen_at`` and the name keys are paid once per batch:

====================  ==============  =======================================================
``seen_at``           timestamptz     the database time of the claim (the partition key)
``namespace_key``     bigint          the consumer name's key (``names.py``)
``handler_key``       bigint          the handler's qualified name's key
``uuids``             uuid[]          the ids that are canonical UUIDs, 16 bytes each
``texts``             text[] "C"      every other id, as written
``details``           jsonb           only with ``DedupPolicy(diagnostics=True)``: per id,
                                      the event type, id source, topic, partition, offset
                                      and event time; else null (no bytes)
====================  ==============  =======================================================

Each id array has a GIN index (``fastupdate`` off: no pending list to grow, scan and flush);
an id costs one GIN entry and its share of an array. ``texts`` uses the ``"C"`` collation:
ids compare byte by byte, and the index does not depend on the C library's collation rules.
``{table}_ids`` is a view with one row per id (namespace, event_id, seen_at, handler,
details), for people and tests; consumers never read it.

The claim keeps the rules of :mod:`consumerkit.dedup.postgres`: the wait for a concurrent
claim of each (namespace, id), in sorted order (:mod:`consumerkit.dedup.guard`), then a lookup
that sees every transaction that held an id before, then the window. The ``"table"`` layout
claims the same way (it has no unique key to wait on any more) and adds a ``seen_at`` index
for its batched cleanup.
"""

from __future__ import annotations

from datetime import timedelta

from ..shared.identifiers import identifier, qualified
from .guard import ADVISORY_WAIT, GUARD_WAIT, guard_ddl, guard_name
from .ids import UUID_SQL_PATTERN
from .names import FUNCTION as NAME_KEY
from .names import TABLE as NAMES
from .names import key_sql
from .partitions import LOCK_SEED, check_partition_names
from .policy import DedupPolicy

_CLAIM_MANY_BODY = """
DECLARE
    v_lock_timeout text := current_setting('lock_timeout');
    v_ns bigint := %(ns_key)s;
    v_uuids uuid[];
    v_texts text[] COLLATE "C";
    v_ids text[] COLLATE "C";
    v_entries tid[];
    v_is_uuid boolean[];
    v_horizon timestamptz;
    v_status text[];
    v_seen timestamptz[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'consumerkit dedup claims need READ COMMITTED isolation, not %%',
            current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'a snapshot older than the claim lock can miss a concurrent claim';
    END IF;
    -- the wait for a concurrent claim of any of our ids, each distinct id once, in sorted
    -- order: two batches that share ids wait for each other instead of deadlocking
    -- (consumerkit.dedup.guard)
    v_ids := ARRAY(SELECT DISTINCT e COLLATE "C" FROM unnest(p_event_ids) AS e ORDER BY 1);
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
@WAIT@    PERFORM set_config('lock_timeout', v_lock_timeout, true);
    -- every statement from here takes a fresh snapshot (READ COMMITTED, VOLATILE): it sees
    -- every transaction that held one of our ids before us. An id is a canonical UUID
    -- when it has the form's 36 bytes and the uuid type prints it back unchanged: the cast
    -- costs a fifth of the pattern match. It fails on 36 bytes the type cannot read (rare:
    -- other ids are shorter or longer and never reach it); that batch takes the pattern
    BEGIN
        v_is_uuid := ARRAY(SELECT CASE WHEN octet_length(e) = 36 THEN e::uuid::text = e
                                       ELSE false END
                             FROM unnest(p_event_ids) AS e);
    EXCEPTION WHEN invalid_text_representation THEN
        v_is_uuid := ARRAY(SELECT e ~ '%(uuid)s' FROM unnest(p_event_ids) AS e);
    END;
    -- a row's seen_at is the now() of a transaction that committed before we got its lock:
    -- earlier than this clock reading. The day's margin outlasts any step back of the clock;
    -- the bound leaves out the partitions made ahead (each probe of one costs as much as a
    -- probe of a full one)
    v_horizon := clock_timestamp() + interval '1 day';
    SELECT coalesce(array_agg(DISTINCT s.e::uuid) FILTER (WHERE s.u), '{}'),
           coalesce(array_agg(DISTINCT s.e) FILTER (WHERE NOT s.u), '{}')
      INTO v_uuids, v_texts FROM unnest(p_event_ids, v_is_uuid) AS s(e, u);
    WITH input AS (
        SELECT u.ord, u.event_id::text COLLATE "C" AS event_id, u.event_time
          FROM unnest(p_event_ids, p_event_times) WITH ORDINALITY AS u(event_id, event_time, ord)
    ), seen AS (
        SELECT x.id::text COLLATE "C" AS event_id, min(t.seen_at) AS seen_at
          FROM %(table)s AS t CROSS JOIN LATERAL unnest(t.uuids) AS x(id)
         WHERE t.namespace_key = v_ns AND t.seen_at <= v_horizon AND t.uuids && v_uuids
           AND x.id = ANY (v_uuids)
         GROUP BY x.id
        UNION ALL
        SELECT x.id, min(t.seen_at)
          FROM %(table)s AS t CROSS JOIN LATERAL unnest(t.texts) AS x(id)
         WHERE t.namespace_key = v_ns AND t.seen_at <= v_horizon AND t.texts && v_texts
           AND x.id = ANY (v_texts)
         GROUP BY x.id
    ), judged AS (
        SELECT i.*, s.seen_at,
               CASE WHEN s.seen_at IS NOT NULL THEN 'duplicate'
                    WHEN i.event_time IS NOT NULL AND i.event_time < now() - p_retention
                        THEN 'expired'
                    ELSE 'fresh' END AS verdict
          FROM input AS i LEFT JOIN seen AS s ON s.event_id = i.event_id
    ), ranked AS (
        SELECT j.ord, j.seen_at,
               CASE WHEN j.verdict <> 'fresh' THEN j.verdict
                    WHEN row_number() OVER (PARTITION BY j.event_id, j.verdict = 'fresh'
                                            ORDER BY j.ord) = 1 THEN 'claimed'
                    ELSE 'duplicate' END AS status
          FROM judged AS j
    )
    SELECT array_agg(r.status ORDER BY r.ord), array_agg(r.seen_at ORDER BY r.ord)
      INTO v_status, v_seen FROM ranked AS r;
    IF 'claimed' = ANY (v_status) THEN
        -- the names behind the keys, for the {table}_ids view (a plain insert: no wait)
        PERFORM %(name_key)s(s.name)
           FROM (SELECT DISTINCT h AS name FROM unnest(p_handlers || p_namespace) AS h) AS s;
        INSERT INTO %(table)s (seen_at, namespace_key, handler_key, uuids, texts, details)
        SELECT now(), v_ns, %(handler_key)s,
               array_agg(c.event_id::uuid ORDER BY c.ord) FILTER (WHERE c.is_uuid),
               array_agg(c.event_id ORDER BY c.ord) FILTER (WHERE NOT c.is_uuid),
               jsonb_object_agg(c.event_id, jsonb_build_object(
                   'event_type', c.event_type, 'id_source', c.id_source, 'topic', c.topic,
                   'partition', c.part, 'offset', c.off, 'event_time', c.event_time))
                   FILTER (WHERE p_topics IS NOT NULL)
          FROM unnest(p_event_ids, v_status, p_handlers, p_event_types, p_id_sources,
                      p_topics, p_partitions, p_offsets, p_event_times, v_is_uuid)
               WITH ORDINALITY AS c(event_id, status, handler, event_type, id_source, topic,
                                    part, off, event_time, is_uuid, ord)
         WHERE c.status = 'claimed'
         GROUP BY c.handler;
    END IF;
    RETURN QUERY
    SELECT u.ord::integer, u.status, u.seen_at
      FROM unnest(v_status, v_seen) WITH ORDINALITY AS u(status, seen_at, ord) ORDER BY u.ord;
END
"""
# plan_cache_mode: a custom plan turns "= ANY (v_uuids)" into a hash lookup; a generic plan
# would compare every id of a matched row with every id of the batch. enable_seqscan: a
# young partition has no statistics, and scanning it evaluates "&&" on every row.


def lock_timeout_setting(timeout: timedelta) -> str:
    """``timeout`` as a ``lock_timeout`` value: whole milliseconds, at least 1 (0 would mean
    no timeout at all)."""
    return f"{max(1, timeout // timedelta(milliseconds=1))}ms"


def claim_function(schema: str, table: str, suffix: str = "claim") -> str:
    """The quoted, schema-qualified name of ``table``'s claim function (validated)."""
    name = identifier(f"{table}_{suffix}", "claim function")
    return f"{identifier(schema, 'schema name')}.{name}"


def object_names(table: str) -> dict[str, str]:
    """The quoted names of a dedup table's indexes and view, validated (63 characters)."""
    return {
        "uuids": identifier(f"{table}_uuids_idx", "dedup index name"),
        "texts": identifier(f"{table}_texts_idx", "dedup index name"),
        "seen": identifier(f"{table}_seen_idx", "dedup index name"),
        "view": identifier(f"{table}_ids", "dedup view name"),
    }


def check_dedup_names(schema: str, policy: DedupPolicy) -> None:
    """Validate every name derived from ``policy.table`` before any SQL runs: the table, its
    indexes, view, guard and claim function and (partitioned layout) its partitions must each
    fit PostgreSQL's 63 characters."""
    qualified(schema, policy.table)
    claim_function(schema, policy.table, "claim_many")
    object_names(policy.table)
    guard_ddl(schema, policy.table)
    if policy.layout == "partitioned":
        check_partition_names(policy.table)


def create_table_ddl(schema: str, policy: DedupPolicy) -> str:
    """The table of ``policy``'s layout, without its indexes. No default partition, on
    purpose: a missing partition fails the claim loudly rather than filling a partition that
    retention can never drop."""
    check_dedup_names(schema, policy)
    partitioned = " PARTITION BY RANGE (seen_at)" if policy.layout == "partitioned" else ""
    return f"""CREATE TABLE {qualified(schema, policy.table)} (
            seen_at timestamptz NOT NULL DEFAULT now(),
            namespace_key bigint NOT NULL,
            handler_key bigint NOT NULL,
            uuids uuid[],
            texts text[] COLLATE "C",
            details jsonb
        ){partitioned}"""


def index_ddl(schema: str, policy: DedupPolicy) -> list[str]:
    """The id indexes (partitioned with the table), and the table layout's ``seen_at`` index
    that its cleanup walks."""
    table = qualified(schema, policy.table)
    names = object_names(policy.table)
    statements = [
        f"CREATE INDEX {names['uuids']} ON {table} USING gin (uuids) WITH (fastupdate = off)",
        f"CREATE INDEX {names['texts']} ON {table} USING gin (texts) WITH (fastupdate = off)",
    ]
    if policy.layout == "table":
        statements.append(f"CREATE INDEX {names['seen']} ON {table} (seen_at)")
    return statements


def view_ddl(schema: str, policy: DedupPolicy) -> str:
    """``{table}_ids``: one row per id, with the names in text."""
    names = qualified(schema, NAMES)
    return f"""CREATE OR REPLACE VIEW {identifier(schema)}.{object_names(policy.table)['view']} AS
        SELECT n.name AS namespace, e.event_id, t.seen_at, h.name AS handler,
               t.details -> e.event_id AS details
          FROM {qualified(schema, policy.table)} AS t
         CROSS JOIN LATERAL (SELECT x.name FROM {names} AS x
                              WHERE x.id = t.namespace_key LIMIT 1) AS n
         CROSS JOIN LATERAL (SELECT x.name FROM {names} AS x
                              WHERE x.id = t.handler_key LIMIT 1) AS h
         CROSS JOIN LATERAL (SELECT u::text COLLATE "C" FROM unnest(t.uuids) AS u
                             UNION ALL SELECT x FROM unnest(t.texts) AS x) AS e(event_id)"""


WAITS = {"guard": GUARD_WAIT, "advisory": ADVISORY_WAIT,
         "guard and advisory": GUARD_WAIT + ADVISORY_WAIT, "none": ""}
"""The claim function's ways to wait: today's guard; the advisory locks per id of the versions
before it; both, for the upgrade from one to the other (their claims exclude each other);
none at all, for the torture's mutant ``claim_no_wait`` only (:mod:`.no_wait`)."""


def claim_many_ddl(schema: str, policy: DedupPolicy, wait: str = "guard",
                   suffix: str = "claim_many") -> str:
    """The statement (re)creating ``{table}_claim_many`` (or ``{table}_{suffix}``) over the
    lean rows, waiting the way ``wait`` names (a key of :data:`WAITS`)."""
    function = claim_function(schema, policy.table, suffix)
    body = _CLAIM_MANY_BODY.replace("@WAIT@", WAITS[wait]) % {
        "seed": LOCK_SEED, "guard": qualified(schema, guard_name(policy.table)),
        "table": qualified(schema, policy.table), "uuid": UUID_SQL_PATTERN,
        "ns_key": key_sql("p_namespace"), "handler_key": key_sql("c.handler"),
        "name_key": qualified(schema, NAME_KEY)}
    return f"""CREATE OR REPLACE FUNCTION {function}(
            p_namespace text, p_event_ids text[], p_event_times timestamptz[],
            p_retention interval, p_handlers text[], p_event_types text[], p_id_sources text[],
            p_topics text[], p_partitions integer[], p_offsets bigint[], p_lock_timeout text)
        RETURNS TABLE (ord integer, status text, original_seen_at timestamptz)
        LANGUAGE plpgsql VOLATILE
        SET plan_cache_mode = force_custom_plan SET enable_seqscan = off
        AS $claim$ {body} $claim$"""
