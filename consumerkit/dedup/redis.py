"""A Redis "seen" cache in front of the PostgreSQL dedup store (needs the ``redis`` extra).

PostgreSQL stays the source of truth; the cache only saves transactions for events it knows
were applied:

- :meth:`RedisDedupCache.known` is asked before the transaction, for a whole batch in one
  round trip. An id it knows is a duplicate without touching the database.
- :meth:`RedisDedupCache.remember` is called only after the database commit, for the ids that
  transaction claimed, in one round trip. An id whose transaction rolled back is never
  remembered, so a hit always means a committed dedup row.

Each is one ``EVALSHA`` of a small Lua script that gets the key prefix and the batch's ids in
one argument (``namespace:id`` lines) and builds the keys itself: ``known`` answers with one
string of ``0``/``1``, one per id; ``remember`` runs ``SET key 1 PX ttl`` per id inside Redis.
One argument to pack and one reply to parse, instead of one per id, is what keeps the cache
cheap for the consumer's CPU (a pipeline of 500 ``SET`` commands costs ten times more). Calls
made while an earlier one of the same kind is out wait and go together in the next round trip
(:mod:`~consumerkit.dedup.coalesce`), so however many lanes ask at once the cache uses two
connections, and a consumer with a record per transaction still sends few, larger calls. Since
the scripts name keys they were not given as keys, the cache needs a standalone Redis (with
replicas or Sentinel if wanted), not Redis Cluster. The scripts are loaded at :meth:`open`, and
again after a Redis restart.

Redis slow, down or flushed costs nothing but the cache's benefit. No call raises: a timeout
(``socket_timeout``, 75 ms by default) or an error counts as a failure, opens a circuit
breaker and answers "nothing known". While the breaker is open no call goes to Redis; after
``retry_interval`` one call tries again, and a success closes the breaker. Each change (down,
up) is logged once on ``consumerkit.dedup``, never per batch. A flushed cache only misses.

Keys are ``<prefix>:<namespace>:<event id>`` (:mod:`~consumerkit.dedup.redis_scripts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from urllib.parse import urlsplit

from ..errors import ConfigurationError, MissingExtraError
from ..shared.identifiers import redact_dsn

try:
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.commands.core import AsyncScript
    from redis.exceptions import RedisError
except ImportError:
    raise MissingExtraError("RedisDedupCache", "redis") from None
from .coalesce import Closed, Coalescer
from .policy import DedupPolicy, cache_ttl
from .redis_scripts import ERROR, KNOWN, REMEMBER, lines

log = logging.getLogger("consumerkit.dedup")

DEFAULT_TTL = timedelta(days=1)


class RedisDedupCache:
    """:class:`~consumerkit.types.DedupCache` on Redis, never raising, with a circuit breaker.

    ``ttl``: how long an applied id is remembered; it must be no longer than the dedup
    retention. Without it the cache uses 1 day, lowered to the retention by :meth:`check`.
    ``socket_timeout``: seconds any Redis call may take (connecting included) before it
    counts as a failure. ``retry_interval``: seconds between attempts while Redis is away.

    Counters, since the cache was built: ``hits`` and ``misses`` (ids asked about), ``failures``
    (calls that failed or timed out), ``breaker_opens`` (times Redis was declared away),
    ``recoveries`` (times it came back) and ``bypassed`` (calls not sent while it was away).
    """

    def __init__(
        self, url: str, *, ttl: timedelta | None = None, prefix: str = "consumerkit:seen",
        socket_timeout: float = 0.075, retry_interval: float = 5.0,
    ) -> None:
        if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
            raise ConfigurationError(
                f"invalid Redis URL {redact_dsn(url)!r}: use redis://, rediss:// or unix://")
        if ttl is not None and ttl < timedelta(milliseconds=1):
            raise ConfigurationError("the dedup cache ttl must be at least 1 millisecond")
        if socket_timeout <= 0 or retry_interval <= 0:
            raise ConfigurationError("socket_timeout and retry_interval must be positive")
        if not prefix:
            raise ConfigurationError("the dedup cache prefix must not be empty")
        self.url = url
        self.prefix = prefix
        self.socket_timeout = socket_timeout
        self.retry_interval = retry_interval
        self._explicit_ttl = ttl
        self.ttl = ttl if ttl is not None else DEFAULT_TTL
        self.hits = self.misses = self.failures = 0
        # told (hits, misses, errors) of every lookup: the consumer's metrics
        self.on_lookup: Callable[[int, int, int], None] | None = None
        self.breaker_opens = self.recoveries = self.bypassed = 0
        self._client: Redis | None = None
        self._known: AsyncScript | None = None
        self._remember: AsyncScript | None = None
        self._open = False  # the breaker: True while Redis is considered away
        self._retry_at = 0.0
        self._probing = False
        self._known_calls: Coalescer[int] = Coalescer(self._send_known)
        self._remember_calls: Coalescer[int] = Coalescer(self._send_remember)
        self._forgetting: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:
        return f"RedisDedupCache({redact_dsn(self.url)!r}, ttl={self.ttl})"

    @property
    def available(self) -> bool:
        """Whether the breaker is closed (the last call to Redis succeeded)."""
        return self._client is not None and not self._open

    def check(self, policy: DedupPolicy) -> None:
        """Check the cache against the consumer's dedup policy, at start-up: an explicit
        ``ttl`` longer than ``policy.retention`` raises :class:`ConfigurationError` (the cache
        could then know ids the database has forgotten); the default ttl is lowered to the
        retention when that is shorter."""
        self.ttl = cache_ttl(self._explicit_ttl, DEFAULT_TTL, policy)

    async def open(self) -> None:
        """Connect and ping once. Redis being away is no error: the breaker starts open."""
        self._open = self._probing = False  # a cache opened again starts afresh
        self._known_calls = Coalescer(self._send_known)
        self._remember_calls = Coalescer(self._send_remember)
        self._client = Redis.from_url(
            self.url, socket_timeout=self.socket_timeout,
            socket_connect_timeout=self.socket_timeout, retry=Retry(NoBackoff(), 0),
            health_check_interval=0)
        self._known = self._client.register_script(KNOWN)
        self._remember = self._client.register_script(REMEMBER)
        try:
            async with asyncio.timeout(self._deadline):
                await self._client.ping()
                for script in (self._known, self._remember):
                    await self._client.script_load(script.script)
        except Exception as exc:
            self._failed(exc)
        else:
            log.info("dedup cache at %s ready (ttl %s)", redact_dsn(self.url), self.ttl)

    async def known(self, namespace: str, event_ids: Sequence[str]) -> set[str]:
        """The ids of ``event_ids`` the cache knows were applied in ``namespace``; an empty
        set when Redis is away. One round trip, shared with concurrent calls."""
        if not event_ids:
            return set()
        if not self._admit():
            self._looked_up(0, 0, len(event_ids))
            return set()
        probe = self._open
        try:
            flags = await self._known_calls.ask(lines(namespace, event_ids), len(event_ids))
        except Closed:
            self._looked_up(0, 0, len(event_ids))
            return set()
        except asyncio.CancelledError:
            self._gave_up(probe)
            raise
        found = {event_id for event_id, flag in zip(event_ids, flags, strict=True)
                 if flag == 0x31}  # b"1"
        errors = flags.count(ERROR[0]) if len(found) < len(event_ids) else 0
        self.hits += len(found)
        self.misses += len(event_ids) - len(found) - errors
        self._looked_up(len(found), len(event_ids) - len(found) - errors, errors)
        return found

    def _looked_up(self, hits: int, misses: int, errors: int) -> None:
        if self.on_lookup is not None:
            self.on_lookup(hits, misses, errors)

    async def remember(self, namespace: str, event_ids: Sequence[str]) -> None:
        """Remember ``event_ids`` as applied in ``namespace`` for ``ttl``; call it only after
        the transaction that claimed them committed. One round trip, shared with concurrent
        calls; nothing if Redis is away."""
        if not event_ids or not self._admit():
            return
        probe = self._open
        try:
            await self._remember_calls.ask(lines(namespace, event_ids), len(event_ids))
        except Closed:
            pass
        except asyncio.CancelledError:
            self._gave_up(probe)
            raise

    async def _send_known(self, payloads: list[bytes], count: int) -> bytes:
        """One ``known`` round trip; all ``0`` when it fails or the breaker opened while
        these calls waited."""
        if not self._sendable():
            return ERROR * count
        assert self._known is not None  # _sendable says so
        try:
            async with asyncio.timeout(self._deadline):
                flags = bytes(await self._known(args=[self._base, b"\n".join(payloads)]))
            if len(flags) != count:
                raise ValueError(f"{len(flags)} answers for {count} ids")
        except Exception as exc:
            self._failed(exc)
            return ERROR * count
        self._succeeded()
        return flags

    async def _send_remember(self, payloads: list[bytes], count: int) -> bytes:
        if self._sendable():
            assert self._remember is not None
            ttl_ms = max(1, self.ttl // timedelta(milliseconds=1))
            try:
                async with asyncio.timeout(self._deadline):
                    await self._remember(args=[self._base, ttl_ms, b"\n".join(payloads)])
            except Exception as exc:
                self._failed(exc)
            else:
                self._succeeded()
        return b"1" * count  # nothing to answer: one item per id, for the coalescer

    async def close(self) -> None:
        await self._known_calls.close()
        await self._remember_calls.close()
        await asyncio.gather(*self._forgetting, return_exceptions=True)
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    def key(self, namespace: str, event_id: str) -> bytes:
        """The Redis key of ``event_id`` in ``namespace``."""
        return self._base + lines(namespace, [event_id])

    @property
    def _base(self) -> bytes:
        return f"{self.prefix}:".encode("utf-8", "surrogatepass")

    @property
    def _deadline(self) -> float:
        # connecting and one request/reply, each bounded by socket_timeout
        return 2 * self.socket_timeout

    def _admit(self) -> bool:
        """Whether a call may go to Redis now: always while the breaker is closed; while it
        is open, one call at a time once ``retry_interval`` has passed."""
        if self._client is None:
            return False
        if not self._open:
            return True
        if self._probing or time.monotonic() < self._retry_at:
            self.bypassed += 1
            return False
        self._probing = True
        return True

    def _gave_up(self, probe: bool) -> None:
        """A call cancelled before its answer: if it was the probe, another call may try."""
        if probe:
            self._probing = False

    def _sendable(self) -> bool:
        """Whether a round trip of admitted calls may go: not once the breaker opened while
        they waited, unless one of them is the probe."""
        return self._client is not None and (not self._open or self._probing)

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        self._probing = False
        self._retry_at = time.monotonic() + self.retry_interval
        if not self._open:
            self._open = True
            self.breaker_opens += 1
            log.warning(
                "dedup cache at %s unavailable (%s): deduplicating on PostgreSQL alone, "
                "trying again every %gs", redact_dsn(self.url),
                type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}",
                self.retry_interval)
            self._forget_idle()

    def _forget_idle(self) -> None:
        """Close the pool's idle connections: their server may be gone, and each would fail
        once when used after the recovery, opening the breaker again."""
        if self._client is None:
            return
        task = asyncio.get_running_loop().create_task(
            _disconnect_idle(self._client), name="consumerkit-redis-forget-idle")
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)

    def _succeeded(self) -> None:
        self._probing = False
        if self._open:
            self._open = False
            self.recoveries += 1
            log.warning("dedup cache at %s is back", redact_dsn(self.url))


async def _disconnect_idle(client: Redis) -> None:
    with contextlib.suppress(RedisError, OSError):
        await client.connection_pool.disconnect(inuse_connections=False)
