import asyncio
import functools
import random
from collections.abc import Awaitable, Callable, Hashable

from consumerkit.engine.lanes import KeyedExecutor, KeyedLanes

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


async def test_lanes_start_groups_without_tasks_once_the_submitting_step_ends() -> None:
    started: list[tuple[Hashable, list[int]]] = []
    lanes: KeyedLanes[int] = KeyedLanes(lambda key, group: started.append((key, group)),
                                        max_group=2)
    tasks = len(asyncio.all_tasks())
    for n in range(5):
        lanes.submit("a", n)
    lanes.submit("b", 10)
    assert started == []  # items submitted in the same step join the first group
    await asyncio.sleep(0)
    assert started == [("a", [0, 1]), ("b", [10])]
    assert len(asyncio.all_tasks()) == tasks
    lanes.submit("a", 5)  # waits behind the group out
    assert lanes.busy == 2
    lanes.done("a")
    assert started[-1] == ("a", [2, 3])
    lanes.done("b")
    lanes.done("a")
    assert started[-1] == ("a", [4, 5])
    lanes.done("a")
    await asyncio.wait_for(lanes.join(), 1)
    assert lanes.busy == 0


async def test_a_dropped_lane_gives_up_the_items_after_its_group() -> None:
    started: list[list[int]] = []
    lanes: KeyedLanes[int] = KeyedLanes(lambda key, group: started.append(group))
    for n in range(4):
        lanes.submit("a", n)
    await asyncio.sleep(0)
    assert started == [[0]]
    assert lanes.drop("a") == 3
    await asyncio.wait_for(lanes.join(), 1)
    lanes.submit("a", 9)  # a new lane of the same key starts afresh
    await asyncio.sleep(0)
    assert started == [[0], [9]]


async def test_a_raising_start_stops_its_lane_and_is_reported() -> None:
    def start(key: Hashable, group: list[int]) -> None:
        if key == "bad":
            raise RuntimeError("bug")

    lanes: KeyedLanes[int] = KeyedLanes(start)
    lanes.submit("bad", 1)
    lanes.submit("bad", 2)
    lanes.submit("good", 3)
    await asyncio.sleep(0)
    assert isinstance(lanes.errors[0], RuntimeError)
    assert lanes.failed.is_set()
    assert lanes.busy == 1  # the good lane's group is out


async def _until(predicate: object) -> None:
    assert callable(predicate)
    while not predicate():
        await asyncio.sleep(0)
