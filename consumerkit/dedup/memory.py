"""An in-memory dedup store, for tests: the semantics of the PostgreSQL stores, in a dict.

A claim made inside a transaction is pending until :meth:`InMemoryDedupStore.ended` says how
that transaction ended: committed, its ids become known; rolled back, they leave no trace. A
concurrent claim of a pending id waits until the holding transaction ends (bounded by
``lock_timeout``, then ``asyncpg.LockNotAvailableError`` as from PostgreSQL), then sees its
outcome. Transactions are told apart by the ``tx`` object alone; nothing is written to it.

Every claim's verdicts (duplicates within one call, the window, the original's time) follow
the PostgreSQL claim functions. Nothing survives the process, so it must never stand behind a
real consumer: the consumer always keeps its dedup rows in PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import asyncpg

from ..types import Claim, ClaimRequest, ClaimStatus, DbConnection

_Key = tuple[str, str]  # (namespace, event id)


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(slots=True)
class _Hold:
    owner: object
    seen_at: datetime
    released: asyncio.Event = field(default_factory=asyncio.Event)


class InMemoryDedupStore:
    """:class:`~consumerkit.types.DedupStore` in process memory (tests only).

    ``retention`` and ``clock_skew`` play their :class:`~consumerkit.dedup.DedupPolicy` roles:
    a claim of an event older than ``retention`` is ``EXPIRED``, and :meth:`purge` forgets ids
    first seen more than ``retention + clock_skew`` ago. ``clock`` gives the store's time.
    """

    def __init__(
        self, retention: timedelta = timedelta(days=7), *,
        clock_skew: timedelta = timedelta(hours=1),
        lock_timeout: timedelta = timedelta(seconds=30),
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.retention = retention
        self.clock_skew = clock_skew
        self.lock_timeout = lock_timeout
        self.clock = clock
        self.waiting = 0  # claims waiting for another transaction right now
        self._committed: dict[_Key, datetime] = {}
        self._pending: dict[_Key, _Hold] = {}
        self._held: dict[int, set[_Key]] = {}  # id(tx) -> its pending keys

    async def claim_many(
        self, tx: DbConnection, namespace: str, requests: Sequence[ClaimRequest], *,
        enforce_window: bool = True,
    ) -> list[Claim]:
        keys = {(namespace, r.envelope.event_id) for r in requests}
        await self._wait_for_others(tx, keys)
        # from here to the end no await: the verdicts and the holds are taken atomically
        now = self.clock()
        held = self._held.setdefault(id(tx), set())
        claimed_now: set[_Key] = set()
        claims: list[Claim] = []
        for request in requests:
            key = (namespace, request.envelope.event_id)
            event_time = request.envelope.event_time if enforce_window else None
            if key in self._committed:
                claims.append(Claim(ClaimStatus.DUPLICATE, self._committed[key]))
            elif key in self._pending and key not in claimed_now:  # ours, an earlier call
                claims.append(Claim(ClaimStatus.DUPLICATE, self._pending[key].seen_at))
            elif event_time is not None and event_time < now - self.retention:
                claims.append(Claim(ClaimStatus.EXPIRED))
            elif key in claimed_now:  # claimed by this very call: its original is applied now
                claims.append(Claim(ClaimStatus.DUPLICATE, now))
            else:
                self._pending[key] = _Hold(tx, now)
                held.add(key)
                claimed_now.add(key)
                claims.append(Claim(ClaimStatus.CLAIMED))
        if not held:
            del self._held[id(tx)]
        return claims

    async def _wait_for_others(self, tx: DbConnection, keys: set[_Key]) -> None:
        """Wait until no other transaction holds any of ``keys``."""
        timeout = self.lock_timeout.total_seconds()
        while True:
            hold = next((h for k in sorted(keys) if (h := self._pending.get(k)) is not None
                         and h.owner is not tx), None)
            if hold is None:
                return
            self.waiting += 1
            try:
                async with asyncio.timeout(timeout):
                    await hold.released.wait()
            except TimeoutError:
                raise asyncpg.LockNotAvailableError(
                    "an event id is held by another transaction for longer than "
                    f"lock_timeout ({timeout:g}s)") from None
            finally:
                self.waiting -= 1

    async def ended(
        self, tx: DbConnection, namespace: str, claimed: Sequence[ClaimRequest], committed: bool,
    ) -> None:
        """End every claim ``tx`` holds (in any namespace, as a database transaction would):
        committed, they become known; else they vanish. Waiting claims then go on."""
        for key in self._held.pop(id(tx), set()):
            hold = self._pending.pop(key)
            if committed:
                self._committed[key] = hold.seen_at
            hold.released.set()

    async def seen(self, conn: DbConnection, namespace: str, event_id: str) -> datetime | None:
        """When ``event_id`` was first claimed in ``namespace`` (committed claims only)."""
        return self._committed.get((namespace, event_id))

    def purge(self, now: datetime | None = None) -> int:
        """Forget the ids first seen before ``now - (retention + clock_skew)``, as maintenance
        does for the tables; returns how many were forgotten."""
        horizon = (now or self.clock()) - (self.retention + self.clock_skew)
        expired = [key for key, seen_at in self._committed.items() if seen_at < horizon]
        for key in expired:
            del self._committed[key]
        return len(expired)
