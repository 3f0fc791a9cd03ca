"""The dedup tables as they were before lean rows (schema steps 1-3 of the partitioned layout,
step 1 of the table layout): one row per event id, with the namespace, the handler and the
diagnostic columns in text.

Kept because migration steps always run in order: a new table is created in this layout and
converted by the next step (:mod:`consumerkit.dedup.upgrade`) in the same transaction, so every
fresh migration also runs the conversion an existing table goes through. Nothing else uses
these statements.
"""

from __future__ import annotations

from ..shared.identifiers import identifier, qualified
from .partitions import LOCK_SEED
from .policy import DedupPolicy
from .rows import check_dedup_names, claim_function

_CLAIM_BODY = """
DECLARE
    v_seen_at timestamptz;
    v_lock_timeout text := current_setting('lock_timeout');
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'consumerkit dedup claims need READ COMMITTED isolation, not %%',
            current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'a snapshot older than the claim lock can miss a concurrent claim';
    END IF;
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    PERFORM pg_advisory_xact_lock(hashtextextended(p_namespace || chr(31) || p_event_id, %(seed)d));
    PERFORM set_config('lock_timeout', v_lock_timeout, true);
    SELECT min(t.seen_at) INTO v_seen_at FROM %(table)s AS t
     WHERE t.namespace = p_namespace AND t.event_id = p_event_id;
    IF v_seen_at IS NOT NULL THEN
        RETURN QUERY SELECT 'duplicate'::text, v_seen_at;
        RETURN;
    END IF;
    IF p_event_time IS NOT NULL AND p_event_time < now() - p_retention THEN
        RETURN QUERY SELECT 'expired'::text, NULL::timestamptz;
        RETURN;
    END IF;
    INSERT INTO %(table)s (namespace, event_id, seen_at, handler, event_type, id_source,
                           topic, "partition", "offset", event_time)
    VALUES (p_namespace, p_event_id, now(), p_handler, p_event_type, p_id_source,
            p_topic, p_partition, p_offset, p_event_time);
    RETURN QUERY SELECT 'claimed'::text, NULL::timestamptz;
END
"""


_CLAIM_MANY_BODY = """
DECLARE
    v_lock_timeout text := current_setting('lock_timeout');
    v_hash bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'consumerkit dedup claims need READ COMMITTED isolation, not %%',
            current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'a snapshot older than the claim lock can miss a concurrent claim';
    END IF;
    -- one lock per distinct id, always taken in the same (sorted) order: two batches that
    -- share ids wait for each other instead of deadlocking
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    FOR v_hash IN
        SELECT DISTINCT hashtextextended(p_namespace || chr(31) || e, %(seed)d)
          FROM unnest(p_event_ids) AS e ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(v_hash);
    END LOOP;
    PERFORM set_config('lock_timeout', v_lock_timeout, true);
    -- this statement takes a fresh snapshot (READ COMMITTED, VOLATILE): it sees every
    -- transaction that held one of our locks before us
    RETURN QUERY
    WITH input AS (
        SELECT u.ord::integer AS ord, u.event_id, u.event_time, u.handler, u.event_type,
               u.id_source, u.topic, u.part, u.off
          FROM unnest(p_event_ids, p_event_times, p_handlers, p_event_types, p_id_sources,
                      p_topics, p_partitions, p_offsets)
               WITH ORDINALITY AS u(event_id, event_time, handler, event_type, id_source,
                                    topic, part, off, ord)
    ), seen AS (
        SELECT t.event_id, min(t.seen_at) AS seen_at FROM %(table)s AS t
         WHERE t.namespace = p_namespace AND t.event_id = ANY (p_event_ids)
         GROUP BY t.event_id
    ), judged AS (
        SELECT i.*, s.seen_at,
               CASE WHEN s.seen_at IS NOT NULL THEN 'duplicate'
                    WHEN i.event_time IS NOT NULL AND i.event_time < now() - p_retention
                        THEN 'expired'
                    ELSE 'fresh' END AS verdict
          FROM input AS i LEFT JOIN seen AS s ON s.event_id = i.event_id
    ), ranked AS (
        SELECT j.*,
               CASE WHEN j.verdict <> 'fresh' THEN j.verdict
                    WHEN row_number() OVER (PARTITION BY j.event_id, j.verdict = 'fresh'
                                            ORDER BY j.ord) = 1 THEN 'claimed'
                    ELSE 'duplicate' END AS status
          FROM judged AS j
    ), inserted AS (
        INSERT INTO %(table)s (namespace, event_id, seen_at, handler, event_type, id_source,
                               topic, "partition", "offset", event_time)
        SELECT p_namespace, r.event_id, now(), r.handler, r.event_type, r.id_source, r.topic,
               r.part, r.off, r.event_time
          FROM ranked AS r WHERE r.status = 'claimed'
    )
    SELECT r.ord, r.status, r.seen_at FROM ranked AS r ORDER BY r.ord;
END
"""


_OLD_SIGNATURES = (
    "text, text, timestamptz, interval, text, text, text, text, integer, bigint",
)
"""Parameter lists of earlier claim functions (before ``p_lock_timeout``)."""


_TABLE_CLAIM_MANY_BODY = """
DECLARE
    v_lock_timeout text := current_setting('lock_timeout');
    v_inserted text[];
    v_fresh text[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'consumerkit dedup claims need READ COMMITTED isolation, not %%',
            current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'a snapshot older than the claim can miss a concurrent claim';
    END IF;
    v_fresh := ARRAY(
        SELECT DISTINCT u.e FROM unnest(p_event_ids, p_event_times) AS u(e, t)
         WHERE u.t IS NULL OR u.t >= now() - p_retention);
    PERFORM set_config('lock_timeout', p_lock_timeout, true);
    WITH input AS (
        SELECT u.ord, u.event_id, u.event_time, u.handler, u.event_type, u.id_source,
               u.topic, u.part, u.off,
               (u.event_time IS NULL OR u.event_time >= now() - p_retention) AS fresh
          FROM unnest(p_event_ids, p_event_times, p_handlers, p_event_types, p_id_sources,
                      p_topics, p_partitions, p_offsets)
               WITH ORDINALITY AS u(event_id, event_time, handler, event_type, id_source,
                                    topic, part, off, ord)
    ), chosen AS (
        SELECT DISTINCT ON (i.event_id) i.* FROM input AS i
         ORDER BY i.event_id, i.fresh DESC, i.ord
    ), inserted AS (
        INSERT INTO %(table)s AS t (namespace, event_id, seen_at, handler, event_type,
                                     id_source, topic, "partition", "offset", event_time)
        SELECT p_namespace, c.event_id, now(), c.handler, c.event_type, c.id_source, c.topic,
               c.part, c.off, c.event_time
          FROM chosen AS c ORDER BY c.event_id
        ON CONFLICT (namespace, event_id) DO NOTHING
        RETURNING t.event_id
    )
    SELECT coalesce(array_agg(inserted.event_id), '{}') INTO v_inserted FROM inserted;
    PERFORM set_config('lock_timeout', v_lock_timeout, true);
    DELETE FROM %(table)s AS t
     WHERE t.namespace = p_namespace AND t.event_id = ANY (v_inserted)
       AND NOT (t.event_id = ANY (v_fresh));
    -- a fresh snapshot: sees the originals that made the insert wait
    RETURN QUERY
    WITH input AS (
        SELECT u.ord::integer AS ord, u.event_id,
               (u.event_time IS NULL OR u.event_time >= now() - p_retention) AS fresh
          FROM unnest(p_event_ids, p_event_times) WITH ORDINALITY AS u(event_id, event_time, ord)
    ), seen AS (
        SELECT t.event_id, min(t.seen_at) AS seen_at FROM %(table)s AS t
         WHERE t.namespace = p_namespace AND t.event_id = ANY (p_event_ids)
           AND NOT (t.event_id = ANY (v_inserted))
         GROUP BY t.event_id
    ), judged AS (
        SELECT i.ord, i.event_id, s.seen_at,
               CASE WHEN NOT (i.event_id = ANY (v_inserted)) THEN 'duplicate'
                    WHEN i.fresh THEN 'fresh'
                    ELSE 'expired' END AS verdict
          FROM input AS i LEFT JOIN seen AS s ON s.event_id = i.event_id
    ), ranked AS (
        SELECT j.ord, j.seen_at,
               CASE WHEN j.verdict <> 'fresh' THEN j.verdict
                    WHEN row_number() OVER (PARTITION BY j.event_id, j.verdict = 'fresh'
                                            ORDER BY j.ord) = 1 THEN 'claimed'
                    ELSE 'duplicate' END AS status
          FROM judged AS j
    )
    SELECT r.ord, r.status, r.seen_at FROM ranked AS r ORDER BY r.ord;
END
"""


def dedup_ddl(schema: str, policy: DedupPolicy) -> list[str]:
    """Statements creating the partitioned dedup table, its index and its claim function, one
    row per id (step 1).

    ``seen_at`` is the database time of the first delivery, not the record's timestamp, so a
    redelivery carrying a different timestamp still lands on the same id. The (namespace,
    event_id) index is partitioned, hence non-unique; the claim function provides uniqueness.
    There is deliberately no default partition: a missing partition fails the claim loudly
    rather than filling a partition that retention can never drop.
    """
    check_dedup_names(schema, policy)
    table = qualified(schema, policy.table)
    index = identifier(f"{policy.table}_event_idx", "dedup index name")
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
            namespace text NOT NULL,
            event_id text NOT NULL,
            seen_at timestamptz NOT NULL DEFAULT now(),
            handler text NOT NULL,
            event_type text,
            id_source text NOT NULL,
            topic text NOT NULL,
            "partition" integer NOT NULL,
            "offset" bigint NOT NULL,
            event_time timestamptz
        ) PARTITION BY RANGE (seen_at)""",
        f"CREATE INDEX IF NOT EXISTS {index} ON {table} (namespace, event_id)",
        *claim_ddl(schema, policy),
    ]


def claim_ddl(schema: str, policy: DedupPolicy) -> list[str]:
    """Statements (re)creating the single-id claim function of ``policy.table`` (step 2),
    whatever version was there before."""
    check_dedup_names(schema, policy)
    function = claim_function(schema, policy.table)
    body = _CLAIM_BODY % {"seed": LOCK_SEED, "table": qualified(schema, policy.table)}
    return [
        # CREATE OR REPLACE with other parameters would add an overload next to the old
        # function, not replace it: drop every earlier signature first.
        *(f"DROP FUNCTION IF EXISTS {function}({signature})" for signature in _OLD_SIGNATURES),
        f"""CREATE OR REPLACE FUNCTION {function}(
            p_namespace text, p_event_id text, p_event_time timestamptz, p_retention interval,
            p_handler text, p_event_type text, p_id_source text, p_topic text,
            p_partition integer, p_offset bigint, p_lock_timeout text)
        RETURNS TABLE (status text, original_seen_at timestamptz)
        LANGUAGE plpgsql VOLATILE
        AS $claim$ {body} $claim$""",
    ]


def claim_many_ddl(schema: str, policy: DedupPolicy) -> list[str]:
    """The statement creating the bulk claim function over one row per id (step 3)."""
    check_dedup_names(schema, policy)
    function = claim_function(schema, policy.table, "claim_many")
    body = _CLAIM_MANY_BODY % {"seed": LOCK_SEED, "table": qualified(schema, policy.table)}
    return [
        f"""CREATE OR REPLACE FUNCTION {function}(
            p_namespace text, p_event_ids text[], p_event_times timestamptz[],
            p_retention interval, p_handlers text[], p_event_types text[], p_id_sources text[],
            p_topics text[], p_partitions integer[], p_offsets bigint[], p_lock_timeout text)
        RETURNS TABLE (ord integer, status text, original_seen_at timestamptz)
        LANGUAGE plpgsql VOLATILE
        AS $claim$ {body} $claim$""",
    ]


def table_dedup_ddl(schema: str, policy: DedupPolicy) -> list[str]:
    """Statements creating the plain dedup table of one row per id, its key, its ``seen_at``
    index and its bulk claim function (table layout, step 1)."""
    table = qualified(schema, policy.table)
    key = identifier(f"{policy.table}_key", "dedup key name")
    seen_index = identifier(f"{policy.table}_seen_idx", "dedup index name")
    function = claim_function(schema, policy.table, "claim_many")
    body = _TABLE_CLAIM_MANY_BODY % {"table": table}
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} (
            namespace text NOT NULL,
            event_id text NOT NULL,
            seen_at timestamptz NOT NULL DEFAULT now(),
            handler text NOT NULL,
            event_type text,
            id_source text NOT NULL,
            topic text NOT NULL,
            "partition" integer NOT NULL,
            "offset" bigint NOT NULL,
            event_time timestamptz,
            CONSTRAINT {key} PRIMARY KEY (namespace, event_id)
        )""",
        f"CREATE INDEX IF NOT EXISTS {seen_index} ON {table} (seen_at)",
        f"""CREATE OR REPLACE FUNCTION {function}(
            p_namespace text, p_event_ids text[], p_event_times timestamptz[],
            p_retention interval, p_handlers text[], p_event_types text[], p_id_sources text[],
            p_topics text[], p_partitions integer[], p_offsets bigint[], p_lock_timeout text)
        RETURNS TABLE (ord integer, status text, original_seen_at timestamptz)
        LANGUAGE plpgsql VOLATILE
        AS $claim$ {body} $claim$""",
    ]
