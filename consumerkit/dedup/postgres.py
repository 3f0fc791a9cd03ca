"""The PostgreSQL dedup store: one claim per event, inside the handler's own transaction.

The dedup row and the handler's effects commit or roll back together, so "row exists" means
"effect applied" (no marker saved for a failed handler, no effect without a marker).

Uniqueness of (namespace, event_id) cannot be a unique index: the table is partitioned on
``seen_at``, a unique index on a partitioned table must contain the partition key, and a row
holds the ids of a whole claim call (:mod:`consumerkit.dedup.rows`). The claim function
``{table}_claim_many`` enforces it instead, in both layouts:

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
4. otherwise the id is stored with ``seen_at = now()``: ``claimed``.

A hash collision between two ids only makes one claim wait for the other, never a false hit.
Under REPEATABLE READ or SERIALIZABLE the transaction's snapshot predates the lock wait, so step
2 could miss a concurrent commit: the function refuses those isolation levels outright.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from ..envelope import Envelope
from ..shared import faults
from ..shared.identifiers import qualified
from ..types import Claim, ClaimRequest, ClaimStatus, DbConnection
from .ids import is_canonical_uuid
from .names import key_sql
from .no_wait import without_wait
from .policy import DedupPolicy
from .rows import check_dedup_names, claim_function, lock_timeout_setting

DEFAULT_POLICY = DedupPolicy()
"""The policy used when none is given (``DedupPolicy`` is frozen, so sharing it is safe)."""


class PostgresDedupStore:
    """:class:`~consumerkit.types.DedupStore` over the dedup table of ``policy``, whatever its
    layout: both layouts answer the same ``{table}_claim_many`` call over the same rows (see
    :mod:`consumerkit.dedup.rows`).

    Create the table with :func:`consumerkit.migrate` and keep it with
    :func:`consumerkit.dedup.partitions.maintain`. A claim is one round trip: asyncpg keeps the
    claim statement prepared per connection after its first use.
    """

    def __init__(self, schema: str = "consumerkit", policy: DedupPolicy = DEFAULT_POLICY) -> None:
        self.schema = schema
        self.policy = policy
        check_dedup_names(schema, self.policy)
        many = claim_function(schema, self.policy.table, "claim_many")
        self._claim_many_sql = (
            f"SELECT ord, status, original_seen_at FROM {many}"
            "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)")
        # the usual batch, all of one handler: its name once, not once per id
        self._claim_one_handler_sql = (
            f"SELECT ord, status, original_seen_at FROM {many}($1, $2, $3, $4, "
            "array_fill($5::text, ARRAY[cardinality($2::text[])]), $6, $7, $8, $9, $10, $11)")
        self._lock_timeout = lock_timeout_setting(self.policy.claim_lock_timeout)
        seen = (f"SELECT min(t.seen_at) FROM {qualified(schema, self.policy.table)} AS t "
                f"WHERE t.namespace_key = {key_sql('$1::text')} AND ")
        self._seen_uuid_sql = seen + "t.uuids @> ARRAY[$2::uuid]"
        self._seen_text_sql = seen + 't.texts @> ARRAY[$2::text COLLATE "C"]'

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
        # without diagnostics the function stores no details: nothing to send for them
        diagnostics = self.policy.diagnostics
        times: list[datetime | None] | None = None
        if diagnostics:
            times = [e.event_time if enforce_window else None for e in envs]
        elif enforce_window:
            times = [e.event_time for e in envs]
            if self._young(times):  # none can be expired: no time to send (a tenth of the
                times = None        # claim's CPU), none to judge
        handler = requests[0].handler
        handlers: str | list[str] = handler
        sql = self._claim_one_handler_sql
        if any(r.handler != handler for r in requests):
            sql, handlers = self._claim_many_sql, [r.handler for r in requests]
        if faults.inject("claim_no_wait"):  # broken on purpose: see faults
            sql = await without_wait(tx, self.schema, self.policy, sql)
        rows = await tx.fetch(
            sql, namespace, [e.event_id for e in envs], times, self.policy.retention,
            handlers,
            [e.event_type for e in envs] if diagnostics else None,
            [e.id_source for e in envs] if diagnostics else None,
            [e.topic for e in envs] if diagnostics else None,
            [e.partition for e in envs] if diagnostics else None,
            [e.offset for e in envs] if diagnostics else None, self._lock_timeout)
        assert len(rows) == len(requests)  # one row per request, in request order
        claims = [_claim(row["status"], row["original_seen_at"]) for row in rows]
        if any(c is _IN_BATCH for c in claims):
            # a duplicate of an id this very batch claims: its original is applied now, in
            # this transaction (the function has no committed time to give for it)
            now = Claim(ClaimStatus.DUPLICATE, datetime.now(UTC))
            claims = [now if c is _IN_BATCH else c for c in claims]
        return claims

    def _young(self, times: list[datetime | None]) -> bool:
        """Whether every time of ``times`` is within half the retention of now, by this
        process's clock: so far inside the window that the database's clock, even hours
        ahead, cannot judge any of them expired."""
        known = [t for t in times if t is not None]
        if not known:
            return True
        try:
            return min(known) > datetime.now(UTC) - self.policy.retention / 2
        except TypeError:  # a time without a zone (given by hand): sent, and judged there
            return False

    async def ended(
        self, tx: DbConnection, namespace: str, claimed: Sequence[ClaimRequest], committed: bool,
    ) -> None:
        """Nothing to do: the claims live in the transaction itself."""

    async def seen(self, conn: DbConnection, namespace: str, event_id: str) -> datetime | None:
        """When ``event_id`` was first claimed in ``namespace`` (committed claims only, as
        ``conn`` sees them), or ``None`` if it is unknown or its partition was dropped."""
        sql = self._seen_uuid_sql if is_canonical_uuid(event_id) else self._seen_text_sql
        value: datetime | None = await conn.fetchval(sql, namespace, event_id)
        return value


_STATUSES = {status.value: status for status in ClaimStatus}
_PLAIN = {status.value: Claim(status) for status in ClaimStatus}
_IN_BATCH = _PLAIN[ClaimStatus.DUPLICATE.value]


def _claim(status: str, seen_at: datetime | None) -> Claim:
    """A row of the claim as a :class:`Claim`; one shared (immutable) claim per status when
    no time comes with it. A dict, not ``ClaimStatus(status)``: an enum lookup by value costs
    more than the rest of a record's claim in Python."""
    if seen_at is None:
        return _PLAIN[status]
    return Claim(_STATUSES[status], seen_at)

