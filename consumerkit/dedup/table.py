"""The "table" dedup layout: one plain table with a unique key, cleaned by batched DELETE.

For databases where partitioning is unwelcome, and as the usual design to compare with. The
claim is the same call as the partitioned layout's (``{table}_claim_many``, same parameters,
same results), so :class:`~consumerkit.dedup.postgres.PostgresDedupStore` drives both; only
the SQL behind it differs.

Uniqueness is the primary key on (namespace, event_id), so no advisory lock is needed:
``INSERT ... ON CONFLICT DO NOTHING`` that meets an id inserted by a transaction still open
waits for that transaction to end (bounded by ``claim_lock_timeout``, like the partitioned
claim's lock). Under READ COMMITTED it then sees the outcome: committed, the conflict stands
and nothing is inserted (``duplicate``); rolled back, the row is inserted (``claimed``).

The insert, the original's ``seen_at`` and the verdicts cannot be one plain statement: a
statement keeps the snapshot it started with, so after waiting it would not see the row that
made it wait. The function runs them as separate statements, each with a fresh snapshot, and
stays one round trip:

1. insert one row per distinct id (its first in-window occurrence, else its first), in
   event-id order so that two batches sharing ids wait for each other instead of deadlocking;
2. an id inserted whose every occurrence is older than the window is ``expired``: its row is
   deleted again in the same transaction. It served as the lock: a concurrent claim of the id
   waits until this transaction ends, exactly as behind the partitioned layout's lock;
3. an id not inserted is a ``duplicate``; its original ``seen_at`` is read afresh;
4. occurrences are ranked as in the partitioned function: the first in-window occurrence of
   an inserted id is ``claimed``, later ones ``duplicate`` (without a time), out-of-window ones
   ``expired``.
"""

from __future__ import annotations

from .._identifiers import identifier, qualified
from .policy import DedupPolicy

_CLAIM_MANY_BODY = """
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


def table_names(table: str) -> dict[str, str]:
    """The quoted names of the objects of the table layout, validated (63 characters)."""
    return {
        "key": identifier(f"{table}_key", "dedup key name"),
        "seen_index": identifier(f"{table}_seen_idx", "dedup index name"),
        "claim_many": identifier(f"{table}_claim_many", "claim function"),
    }


def table_dedup_ddl(schema: str, policy: DedupPolicy) -> list[str]:
    """Statements creating the plain dedup table, its key, its ``seen_at`` index (what the
    batched cleanup walks) and its bulk claim function."""
    table = qualified(schema, policy.table)
    names = table_names(policy.table)
    function = f"{identifier(schema, 'schema name')}.{names['claim_many']}"
    body = _CLAIM_MANY_BODY % {"table": table}
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
            CONSTRAINT {names['key']} PRIMARY KEY (namespace, event_id)
        )""",
        f"CREATE INDEX IF NOT EXISTS {names['seen_index']} ON {table} (seen_at)",
        f"""CREATE OR REPLACE FUNCTION {function}(
            p_namespace text, p_event_ids text[], p_event_times timestamptz[],
            p_retention interval, p_handlers text[], p_event_types text[], p_id_sources text[],
            p_topics text[], p_partitions integer[], p_offsets bigint[], p_lock_timeout text)
        RETURNS TABLE (ord integer, status text, original_seen_at timestamptz)
        LANGUAGE plpgsql VOLATILE
        AS $claim$ {body} $claim$""",
    ]
