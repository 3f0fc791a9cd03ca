"""The handler calls of a transaction's records, and whom a deferred write's failure is
charged to."""

from __future__ import annotations

from collections.abc import Sequence

from ..registry import Route
from ..shared.deferred import Deferred
from .decode import Decoded

Call = tuple[Route, list[Decoded]]
"""A handler, and the records of one call of it (one, or several for a batch handler)."""


def plan(items: Sequence[Decoded]) -> list[Call]:
    """The handler calls for ``items``, in an order that keeps each key's records in order: a
    record of a batch handler joins that handler's latest call unless a record of its key is
    in a later call already; every other record is a call of its own, in turn."""
    first = items[0].route if items else None
    if first is not None and first.batch and all(d.route is first for d in items):
        return [(first, list(items))]  # one batch handler: one call, in the items' order
    calls: list[Call] = []
    latest: dict[Route, int] = {}  # a batch handler's latest call
    last: dict[tuple[str, int, str | None], int] = {}  # a key's latest call
    for decoded in items:
        env, route = decoded.envelope, decoded.route
        key = (env.topic, env.partition, env.key)
        at = latest.get(route, -1) if route.batch else -1
        if at < 0 or last.get(key, -1) > at:
            at = len(calls)
            calls.append((route, []))
            if route.batch:
                latest[route] = at
        calls[at][1].append(decoded)
        last[key] = at
    return calls


def culprit(deferred: Deferred, calls: list[Call], exc: BaseException) -> Decoded | None:
    """The record whose deferred write raised ``exc``, when it is known (one call, of one
    record)."""
    owners = deferred.owners(exc) or frozenset()
    if len(owners) == 1:
        [records] = [calls[index][1] for index in owners]
        if len(records) == 1:
            return records[0]
    return None
