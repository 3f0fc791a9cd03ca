"""Keyed lanes: items of one key go out in submission order, one group at a time; keys go
out concurrently.

A group is up to ``max_group`` consecutive items of one lane. :class:`KeyedLanes` hands a
free lane's next group to a plain callback and waits for :meth:`KeyedLanes.done`: no task
per lane, so a batch that gathers the groups of hundreds of keys costs no task switch per
key. :class:`KeyedExecutor` runs each group in a task of its own."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

Start = Callable[[Hashable, list[T]], None]
Runner = Callable[[Hashable, list[T]], Awaitable[None]]


class KeyedLanes(Generic[T]):
    """Per-key FIFO lanes. ``start(key, group)`` is called when a lane has items and no group
    out; whoever took the group calls ``done(key)`` once it has finished with it, and the
    lane's next group (if any) starts then. A raising ``start`` is a bug: it is kept in
    ``errors`` and its lane stops (later items of that key never start, so nothing after it
    is acknowledged)."""

    def __init__(self, start: Start[T], max_group: int = 1) -> None:
        if max_group < 1:
            raise ValueError("max_group must be at least 1")
        self._start = start
        self.max_group = max_group  # may change while running
        self._lanes: dict[Hashable, deque[T]] = {}
        self._out: dict[Hashable, int] = {}  # the size of each lane's group out
        self._fresh: list[Hashable] = []  # new lanes, their first group not started yet
        self._idle = asyncio.Event()
        self._idle.set()
        self.errors: list[BaseException] = []
        self.failed = asyncio.Event()

    @property
    def busy(self) -> int:
        """Lanes with items not done."""
        return len(self._lanes)

    def submit(self, key: Hashable, item: T) -> None:
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append(item)
            return
        self._lanes[key] = deque((item,))
        self._idle.clear()
        # started a moment later, together: items submitted in the same step join the group
        if not self._fresh:
            asyncio.get_running_loop().call_soon(self._start_fresh)
        self._fresh.append(key)

    def done(self, key: Hashable) -> None:
        """The group out of ``key``'s lane is finished: start its next group, if any."""
        lane = self._lanes[key]
        for _ in range(self._out.pop(key)):
            lane.popleft()
        if lane:
            self._next(key)
        else:
            self._forget(key)

    def drop(self, key: Hashable) -> int:
        """Give up ``key``'s lane once its group out is finished: the items after it never
        start. Returns how many they were."""
        left = len(self._lanes[key]) - self._out.pop(key)
        self._forget(key)
        return left

    def _start_fresh(self) -> None:
        fresh, self._fresh = self._fresh, []
        for key in fresh:
            if key in self._lanes and key not in self._out:
                self._next(key)

    def _next(self, key: Hashable) -> None:
        lane = self._lanes[key]
        size = min(len(lane), self.max_group)
        group = [lane[i] for i in range(size)] if size > 1 else [lane[0]]
        self._out[key] = size
        try:
            self._start(key, group)
        except BaseException as exc:  # broke its contract: stop this lane, report it
            self._stop(key, exc)

    def _stop(self, key: Hashable, error: BaseException | None = None) -> None:
        """Drop ``key``'s lane, items and all; ``error`` is why, if it is a bug."""
        self._out.pop(key, None)
        if key in self._lanes:
            self._forget(key)
        if error is not None:
            self.errors.append(error)
            self.failed.set()

    def _forget(self, key: Hashable) -> None:
        del self._lanes[key]
        if not self._lanes:
            self._idle.set()

    async def join(self) -> None:
        """Wait until every submitted item is done."""
        await self._idle.wait()


class KeyedExecutor(KeyedLanes[T]):
    """Keyed lanes whose groups each run in a task of their own, ``run(key, group)``, at most
    ``concurrency`` at once. ``run`` must not raise: a raising run is a bug, it is kept in
    ``errors`` and its lane stops."""

    def __init__(self, run: Runner[T], concurrency: int, max_group: int = 1) -> None:
        super().__init__(self._spawn, max_group)
        self._run = run
        self._slots = asyncio.Semaphore(concurrency)
        self._tasks: set[asyncio.Task[None]] = set()

    def _spawn(self, key: Hashable, group: list[T]) -> None:
        task = asyncio.get_running_loop().create_task(self._run_group(key, group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_group(self, key: Hashable, group: list[T]) -> None:
        try:
            async with self._slots:
                await self._run(key, group)
        except asyncio.CancelledError:
            self._stop(key)  # cancelled with the rest (shutdown): its lane goes too
            raise
        except BaseException as exc:  # a run broke its contract: stop this lane, report it
            self._stop(key, exc)
            return
        self.done(key)

    async def cancel(self) -> None:
        """Cancel every running group (it gets ``CancelledError``) and wait for them."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
