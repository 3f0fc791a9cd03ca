"""The PostgreSQL dedup store: one claim per event, inside the handler's own transaction.

The dedup row and the handler's effects commit or roll back together, so "row exists" means
"effect applied" (no marker saved for a failed handler, no effect without a marker).

Uniqueness of (namespace, event_id) cannot be a unique index: the table is partitioned on
``seen_at`` and a unique index on a partitioned table must contain the partition key. The claim
function enforces it instead:

1. ``pg_advisory_xact_lock`` on a hash of (namespace, event_id): a second claim of the same id
   (a zombie consumer still working a revoked partition, say) waits until the first
   transaction commits or rolls back. The wait is bounded by ``policy.claim_lock_timeout``:
   a holder that never ends (a zombie stopped inside its transaction) must not block the new
   owner forever. ``lock_timeout`` is set for the lock alone and restored right after, so the
   handler's own statements keep the session's setting. A timeout raises
   ``asyncpg.LockNotAvailableError`` (55P03), which aborts the transaction; the caller retries;
2. it then looks the id up in every partition. The function is ``VOLATILE``, so under READ
   COMMITTED this statement takes a fresh snapshot and sees the first transaction's commit;
3. an id not found whose event time is older than the retention window is ``expired`` (its
   original may already be forgotten), and nothing is written;
4. otherwise the row is inserted with ``seen_at = now()``: ``claimed``.

A hash collision between two ids only makes one claim wait for the other, never a false hit.
Under REPEATABLE READ or SERIALIZABLE the transaction's snapshot predates the lock wait, so step
2 could miss a concurrent commit: the function refuses those isolation levels outright.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from .._identifiers import identifier, qualified
from ..envelope import Envelope
from ..types import Claim, ClaimRequest, ClaimStatus, DbConnection
from .partitions import LOCK_SEED, check_partition_names
from .policy import DedupPolicy
from .table import table_names

DEFAULT_POLICY = DedupPolicy()
"""The policy used when none is given (``DedupPolicy`` is frozen, so sharing it is safe)."""

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


def lock_timeout_setting(timeout: timedelta) -> str:
    """``timeout`` as a ``lock_timeout`` value: whole milliseconds, at least 1 (0 would mean
    no timeout at all)."""
    return f"{max(1, timeout // timedelta(milliseconds=1))}ms"


def claim_function(schema: str, table: str, suffix: str = "claim") -> str:
    """The quoted, schema-qualified name of ``table``'s claim function (validated)."""
    name = identifier(f"{table}_{suffix}", "claim function")
    return f"{identifier(schema, 'schema name')}.{name}"


def check_dedup_names(schema: str, policy: DedupPolicy) -> None:
    """Validate every name derived from ``policy.table`` before any SQL runs: the table, its
    indexes, its claim functions and (partitioned layout) its partitions must each fit
    PostgreSQL's 63 characters."""
    qualified(schema, policy.table)
    claim_function(schema, policy.table, "claim_many")
    if policy.layout == "table":
        table_names(policy.table)
        return
    identifier(f"{policy.table}_event_idx", "dedup index name")
    claim_function(schema, policy.table)
    check_partition_names(policy.table)


def dedup_ddl(schema: str, policy: DedupPolicy) -> list[str]:
    """Statements creating the partitioned dedup table, its index and its claim function.

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
    """Statements (re)creating the claim function of ``policy.table``: the current version,
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
    """The statement (re)creating the bulk claim function of ``policy.table``: a batch of ids
    claimed in one round trip, with the same locking as the single claim."""
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


class PostgresDedupStore:
    """:class:`~consumerkit.types.DedupStore` over the dedup table of ``policy``, whatever its
    layout: both layouts answer the same ``{table}_claim_many`` call (see
    :mod:`consumerkit.dedup.table` for the ``"table"`` layout's).

    Create the table with :func:`consumerkit.schema.migrate` and keep it with
    :func:`consumerkit.dedup.partitions.maintain`. A claim is one round trip: asyncpg keeps the
    claim statement prepared per connection after its first use.
    """

    def __init__(self, schema: str = "consumerkit", policy: DedupPolicy = DEFAULT_POLICY) -> None:
        self.schema = schema
        self.policy = policy
        check_dedup_names(schema, self.policy)
        function = claim_function(schema, self.policy.table)
        self._claim_sql = (
            f"SELECT status, original_seen_at FROM {function}"
            "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
        many = claim_function(schema, self.policy.table, "claim_many")
        self._claim_many_sql = (
            f"SELECT ord, status, original_seen_at FROM {many}"
            "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
        self._lock_timeout = lock_timeout_setting(self.policy.claim_lock_timeout)
        self._seen_sql = (
            f"SELECT min(seen_at) FROM {qualified(schema, self.policy.table)} "
            "WHERE namespace = $1 AND event_id = $2")

    async def claim(
        self, tx: DbConnection, namespace: str, envelope: Envelope, handler: str, *,
        enforce_window: bool = True,
    ) -> Claim:
        """Claim ``envelope.event_id`` in ``namespace``; run it as the first statement of the
        handler's transaction so the claim lock covers the whole transaction.

        With ``enforce_window`` an event older than ``policy.retention`` comes back
        ``EXPIRED``; without it, such an event is claimed like any other (and its event time is
        not recorded, since it was not checked). An event without a known time
        (``envelope.event_time is None``) cannot be judged either and is claimed the same way.

        Raises ``asyncpg.LockNotAvailableError`` when another transaction holds the same id for
        longer than ``policy.claim_lock_timeout``; ``tx`` is then aborted.
        """
        claims = await self.claim_many(
            tx, namespace, [ClaimRequest(envelope, handler)], enforce_window=enforce_window)
        return claims[0]

    async def claim_many(
        self, tx: DbConnection, namespace: str, requests: Sequence[ClaimRequest], *,
        enforce_window: bool = True,
    ) -> list[Claim]:
        """Claim every request's event id in one round trip (see
        :meth:`consumerkit.types.DedupStore.claim_many`); the same locks, window and errors as
        :meth:`claim`. Locks are taken in a fixed order, so overlapping batches never
        deadlock on them."""
        if not requests:
            return []
        envs = [r.envelope for r in requests]
        rows = await tx.fetch(
            self._claim_many_sql, namespace, [e.event_id for e in envs],
            [e.event_time if enforce_window else None for e in envs], self.policy.retention,
            [r.handler for r in requests], [e.event_type for e in envs],
            [e.id_source for e in envs], [e.topic for e in envs], [e.partition for e in envs],
            [e.offset for e in envs], self._lock_timeout)
        assert len(rows) == len(requests)  # one row per request, in request order
        return [Claim(ClaimStatus(row["status"]), row["original_seen_at"]) for row in rows]

    async def ended(
        self, tx: DbConnection, namespace: str, claimed: Sequence[ClaimRequest], committed: bool,
    ) -> None:
        """Nothing to do: the claims live in the transaction itself."""

    async def seen(self, conn: DbConnection, namespace: str, event_id: str) -> datetime | None:
        """When ``event_id`` was first claimed in ``namespace`` (committed claims only, as
        ``conn`` sees them), or ``None`` if it is unknown or its partition was dropped."""
        value: datetime | None = await conn.fetchval(self._seen_sql, namespace, event_id)
        return value
