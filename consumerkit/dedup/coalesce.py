"""Concurrent requests merged into few round trips, one round trip out at a time.

A consumer with many lanes asks its dedup cache about single records from many tasks at once
(one per record with ``Limits(max_batch=1)``, one per batch otherwise, one per poll). Sent
one by one, those calls would need as many connections as there are tasks, and a client whose
pool has a limit fails them. A :class:`Coalescer` instead sends every request that arrived while the
previous round trip was out together, in one round trip of about ``max_items`` items at most:
under load, fewer and larger calls; when idle, a lone request goes at once, alone.

A request is a payload standing for ``count`` items (for the Redis cache: ids, one per line).
``send`` gets the payloads of a round trip and their number of items, and returns one answer
per item, in order; it must
not raise (a failed round trip answers for every item as the caller decides, e.g. "not
known"). A caller cancelled while waiting leaves the others unharmed. After :meth:`close`,
callers still waiting, and later ones, get :class:`Closed`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Answer = TypeVar("Answer")


class Closed(Exception):
    """The coalescer was closed before the request was answered."""


@dataclass(slots=True)
class _Request(Generic[Answer]):
    payload: bytes
    count: int
    future: asyncio.Future[Sequence[Answer]]


class Coalescer(Generic[Answer]):
    def __init__(self, send: Callable[[list[bytes], int], Awaitable[Sequence[Answer]]], *,
                 max_items: int = 1000) -> None:
        if max_items < 1:
            raise ValueError("max_items must be at least 1")
        self._send = send
        self.max_items = max_items
        self._waiting: deque[_Request[Answer]] = deque()
        self._runner: asyncio.Task[None] | None = None
        self._closed = False
        self.round_trips = 0

    async def ask(self, payload: bytes, count: int) -> Sequence[Answer]:
        """The ``count`` answers to ``payload``, sent with whatever else is waiting."""
        if self._closed:
            raise Closed("the coalescer is closed")
        future: asyncio.Future[Sequence[Answer]] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Request(payload, count, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run(), name="consumerkit-coalesce")
        return await future

    async def close(self) -> None:
        """Stop sending; requests still waiting, or out, get :class:`Closed`."""
        self._closed = True
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
            self._runner = None
        _settle(list(self._waiting), Closed("the coalescer was closed"))
        self._waiting.clear()

    async def _run(self) -> None:
        while group := self._take():
            items = sum(r.count for r in group)
            try:
                answers = await self._send([r.payload for r in group], items)
            except asyncio.CancelledError:  # closed while out: its callers are answered
                _settle(group, Closed("the coalescer was closed"))
                raise
            except Exception as exc:  # a send that broke its word: its callers hear of it
                _settle(group, exc)
                continue
            finally:
                self.round_trips += 1
            if len(answers) != items:
                _settle(group, RuntimeError(f"{len(answers)} answers for {items} items"))
                continue
            start = 0
            for request in group:
                if not request.future.done():  # a caller that gave up is skipped
                    request.future.set_result(answers[start:start + request.count])
                start += request.count

    def _take(self) -> list[_Request[Answer]]:
        """Waiting requests up to ``max_items`` items (at least one request, however large);
        requests whose callers gave up are dropped unsent."""
        group: list[_Request[Answer]] = []
        items = 0
        while self._waiting:
            request = self._waiting[0]
            if not request.future.done():
                if group and items + request.count > self.max_items:
                    break
                group.append(request)
                items += request.count
            self._waiting.popleft()
        return group


def _settle(group: list[_Request[Answer]], exc: Exception) -> None:
    for request in group:
        if not request.future.done():
            request.future.set_exception(exc)
