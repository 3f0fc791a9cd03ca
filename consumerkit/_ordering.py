"""Keyed lanes: messages of one key run one at a time in submission order; keys run
concurrently, at most ``concurrency`` jobs at once."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable

from .types import Job


class KeyedExecutor:
    """Runs jobs in per-key FIFO lanes. A job must not raise: a raising job is a bug, it is
    kept in ``errors`` and its lane stops (later jobs of that key never run, so nothing after
    it is acknowledged)."""

    def __init__(self, concurrency: int) -> None:
        self._slots = asyncio.Semaphore(concurrency)
        self._lanes: dict[Hashable, deque[Job]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.errors: list[BaseException] = []
        self.failed = asyncio.Event()

    def submit(self, key: Hashable, job: Job) -> None:
        lane = self._lanes.get(key)
        if lane is not None:
            lane.append(job)
            return
        lane = self._lanes[key] = deque((job,))
        self._idle.clear()
        task = asyncio.get_running_loop().create_task(self._drain(key, lane))
        self._tasks.add(task)
        task.add_done_callback(self._forget)

    async def _drain(self, key: Hashable, lane: deque[Job]) -> None:
        try:
            while lane:
                async with self._slots:
                    await lane[0]()
                lane.popleft()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a job broke its contract: stop this lane, report it
            self.errors.append(exc)
            self.failed.set()
        finally:
            del self._lanes[key]

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not self._tasks:
            self._idle.set()

    async def join(self) -> None:
        """Wait until every submitted job has run."""
        await self._idle.wait()

    async def cancel(self) -> None:
        """Cancel every lane (running jobs get ``CancelledError``) and wait for them."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
