"""Keyed lanes: items of one key run in submission order, one group at a time; keys run
concurrently, at most ``concurrency`` groups at once.

A group is up to ``max_group`` consecutive items of one lane, handed to ``run`` together (a
transaction can then apply several records of one key in order)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")

Runner = Callable[[Hashable, list[T]], Awaitable[None]]


class KeyedExecutor(Generic[T]):
    """Runs items in per-key FIFO lanes. ``run`` must not raise: a raising run is a bug, it is
    kept in ``errors`` and its lane stops (later items of that key never run, so nothing after
    it is acknowledged)."""

    def __init__(self, run: Runner[T], concurrency: int, max_group: int = 1) -> None:
        if max_group < 1:
            raise ValueError("max_group must be at least 1")
        self._run = run
        self.max_group = max_group  # may change while running
        self._slots = asyncio.Semaphore(concurrency)
        self._lanes: dict[Hashable, deque[T]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.errors: list[BaseException] = []
        self.failed = asyncio.Event()

    def submit(self, key: Hashable, item: T) -> None:
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append(item)
            return
        lane = self._lanes[key] = deque((item,))
        self._idle.clear()
        task = asyncio.get_running_loop().create_task(self._drain(key, lane))
        self._tasks.add(task)
        task.add_done_callback(self._forget)

    async def _drain(self, key: Hashable, lane: deque[T]) -> None:
        try:
            while lane:
                async with self._slots:
                    group = [lane[i] for i in range(min(len(lane), self.max_group))]
                    await self._run(key, group)
                for _ in group:
                    lane.popleft()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a run broke its contract: stop this lane, report it
            self.errors.append(exc)
            self.failed.set()
        finally:
            del self._lanes[key]

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def join(self) -> None:
        """Wait until every submitted item has run."""
        await self._idle.wait()

    async def cancel(self) -> None:
        """Cancel every lane (running groups get ``CancelledError``) and wait for them."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
