"""A dedup cache in the consumer's own memory, for a consumer without Redis."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from datetime import timedelta

from ..errors import ConfigurationError
from .policy import DedupPolicy, cache_ttl

DEFAULT_TTL = timedelta(hours=1)
DEFAULT_MAX_IDS = 100_000


class MemoryDedupCache:
    """:class:`~consumerkit.types.DedupCache` in this process: the ids it applied, for ``ttl``
    (no longer than the dedup retention), the ``max_ids`` most recently remembered kept.

    It knows only what this process applied: a copy of an event applied by another process
    of the group (after a rebalance, say) is absorbed by the store as without a cache; a
    shared cache (:class:`~consumerkit.dedup.RedisDedupCache`) knows those too. It costs no
    round trip, cannot be away, and forgets everything when the process ends."""

    def __init__(self, *, ttl: timedelta | None = None,
                 max_ids: int = DEFAULT_MAX_IDS) -> None:
        if ttl is not None and ttl < timedelta(milliseconds=1):
            raise ConfigurationError("the dedup cache ttl must be at least 1 millisecond")
        if max_ids < 1:
            raise ConfigurationError("the dedup cache's max_ids must be at least 1")
        self._explicit_ttl = ttl
        self.ttl = ttl if ttl is not None else DEFAULT_TTL
        self.max_ids = max_ids
        self.hits = self.misses = 0
        self.on_lookup: Callable[[int, int, int], None] | None = None
        # (namespace, event id) -> when it is forgotten (monotonic), oldest first
        self._ids: OrderedDict[tuple[str, str], float] = OrderedDict()

    def check(self, policy: DedupPolicy) -> None:
        """An explicit ``ttl`` longer than ``policy.retention`` is refused (the cache would
        know ids the database has forgotten); the default is lowered to the retention."""
        self.ttl = cache_ttl(self._explicit_ttl, DEFAULT_TTL, policy)

    async def open(self) -> None:
        self._ids.clear()

    async def known(self, namespace: str, event_ids: Sequence[str]) -> set[str]:
        now = time.monotonic()
        found = {i for i in event_ids
                 if (until := self._ids.get((namespace, i))) is not None and until > now}
        self.hits += len(found)
        self.misses += len(event_ids) - len(found)
        if self.on_lookup is not None:
            self.on_lookup(len(found), len(event_ids) - len(found), 0)
        return found

    async def remember(self, namespace: str, event_ids: Sequence[str]) -> None:
        until = time.monotonic() + self.ttl.total_seconds()
        for event_id in event_ids:
            key = (namespace, event_id)
            self._ids[key] = until
            self._ids.move_to_end(key)
        # every entry has the same ttl, so the oldest remembered expire first
        now = time.monotonic()
        while self._ids and (len(self._ids) > self.max_ids
                             or next(iter(self._ids.values())) <= now):
            self._ids.popitem(last=False)

    async def close(self) -> None:
        self._ids.clear()
