import asyncio
import functools
import random
from collections.abc import Awaitable, Callable, Hashable

from consumerkit._ordering import KeyedExecutor

Job = Callable[[], Awaitable[None]]


async def _each(_key: Hashable, jobs: list[Job]) -> None:
    for job in jobs:
        await job()


def _executor(concurrency: int, max_group: int = 1) -> KeyedExecutor[Job]:
    return KeyedExecutor(_each, concurrency, max_group)


async def test_one_key_runs_in_order_and_keys_overlap() -> None:
    executor = _executor(8)
    seen: dict[str, list[int]] = {}
    running = 0
    peak = 0
    gate = asyncio.Event()

    async def job(key: str, n: int) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if n == 0:
            await gate.wait()  # the first job of every key waits until all keys started
        seen.setdefault(key, []).append(n)
        running -= 1

    for n in range(20):
        for key in "abcd":
            executor.submit(key, functools.partial(job, key, n))
    await asyncio.wait_for(_until(lambda: running == 4), 5)
    gate.set()
    await asyncio.wait_for(executor.join(), 5)
    assert seen == {k: list(range(20)) for k in "abcd"}
    assert peak == 4  # one at a time per key, four keys at once


async def test_concurrency_is_bounded() -> None:
    executor = _executor(3)
    running = 0
    peak = 0
    rng = random.Random(7)

    async def job() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(0)
        running -= 1

    for n in range(200):
        executor.submit(n % 17, job)
    await asyncio.wait_for(executor.join(), 5)
    assert peak == 3


async def test_a_raising_job_stops_its_lane_and_is_reported() -> None:
    executor = _executor(2)
    ran: list[str] = []

    async def boom() -> None:
        raise RuntimeError("bug")

    async def ok(name: str) -> None:
        ran.append(name)

    executor.submit("k", boom)
    executor.submit("k", lambda: ok("after-boom"))
    executor.submit("other", lambda: ok("other"))
    await asyncio.wait_for(executor.join(), 5)
    assert ran == ["other"]
    assert isinstance(executor.errors[0], RuntimeError)
    assert executor.failed.is_set()


async def test_groups_take_consecutive_items_of_one_key_in_order() -> None:
    groups: list[tuple[Hashable, list[int]]] = []
    gate = asyncio.Event()

    async def run(key: Hashable, items: list[int]) -> None:
        groups.append((key, list(items)))
        await gate.wait()

    executor: KeyedExecutor[int] = KeyedExecutor(run, concurrency=4, max_group=3)
    for n in range(8):
        executor.submit("a", n)
    executor.submit("b", 100)
    await asyncio.wait_for(_until(lambda: len(groups) == 2), 5)
    gate.set()
    await asyncio.wait_for(executor.join(), 5)
    assert [items for key, items in groups if key == "a"] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert ("b", [100]) in groups


async def _until(predicate: object) -> None:
    assert callable(predicate)
    while not predicate():
        await asyncio.sleep(0)
