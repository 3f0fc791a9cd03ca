import asyncio
import functools
import random

from consumerkit._ordering import KeyedExecutor


async def test_one_key_runs_in_order_and_keys_overlap() -> None:
    executor = KeyedExecutor(concurrency=8)
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
    executor = KeyedExecutor(concurrency=3)
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
    executor = KeyedExecutor(concurrency=2)
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


async def _until(predicate: object) -> None:
    assert callable(predicate)
    while not predicate():
        await asyncio.sleep(0)
