"""The batcher's gathering and bookkeeping, on a pipeline stand-in: groups are never split and
keep their order, batches are bounded by max_batch and by the pipeline's slots, a lane cut
short ends its batch, and every delivered record gets an outcome or counts as abandoned."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from typing import cast

from pydantic import BaseModel

from consumerkit.engine.batch import Batcher
from consumerkit.engine.decode import Decoded
from consumerkit.engine.lanes import KeyedExecutor, KeyedLanes
from consumerkit.engine.pipeline import Outcome, Pipeline
from consumerkit.envelope import Envelope, Record, RecordLike
from consumerkit.registry import Route
from consumerkit.shared.failures import HandlerFailure
from consumerkit.stats import ConsumerStats, StatsObserver
from consumerkit.types import Claim, ClaimStatus


class _Event(BaseModel):
    n: int


async def _noop(event: _Event, ctx: object) -> None:
    pass


_ROUTE = Route(name="noop", event_type="e", topic=None, model=_Event, func=_noop)


class _Decoder:
    def decode(self, record: RecordLike) -> Decoded:
        env = Envelope(event_id=f"id-{record.offset}", id_source="header", event_type="e",
                       key=None, topic=record.topic, partition=record.partition,
                       offset=record.offset, timestamp=None)
        return Decoded(env, _ROUTE, _Event(n=record.offset))


class FakeUnapplied:
    """What the batcher uses of a pipeline's :class:`~consumerkit.engine.unapplied.Unapplied`."""

    async def join_park(self, records: list[RecordLike], abandon: asyncio.Event,
                        decoded: Decoded | None = None) -> Outcome | None:
        return None  # no key is parked here


class FakePipeline:
    """What the batcher uses of a pipeline; ``gate`` holds every batch until set."""

    def __init__(self, concurrency: int) -> None:
        self.stats = ConsumerStats()
        self.observe = StatsObserver(self.stats)
        self.handler_timeout: float | None = None
        self.decoder = _Decoder()
        self.slots = asyncio.Semaphore(concurrency)
        self.gate = asyncio.Event()
        self.gate.set()
        self.batches: list[list[int]] = []
        self.running = 0
        self.peak = 0
        self.cancelled = 0
        self.alone: list[int] = []
        self.parking = None
        self.unapplied = FakeUnapplied()

    async def apply_batch(self, items: list[Decoded]) -> list[Claim]:
        self.batches.append([d.envelope.offset for d in items])
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.running -= 1
        return [Claim(ClaimStatus.CLAIMED) for _ in items]

    def settled(self, claim: Claim, record: RecordLike, decoded: Decoded) -> Outcome | None:
        self.stats.applied += 1
        return Outcome.APPLIED

    async def process_decoded(self, record: RecordLike, decoded: Decoded,
                              abandon: asyncio.Event, failed: HandlerFailure | None = None,
                              ) -> Outcome:
        self.alone.append(record.offset)
        self.stats.applied += 1
        return Outcome.APPLIED


def _batcher(fake: FakePipeline, max_batch: int) -> Batcher:
    return Batcher(cast(Pipeline, fake), max_batch)


def _records(*offsets: int) -> list[RecordLike]:
    return [Record("t", 0, n, b"k", b"{}") for n in offsets]


class _Reports:
    def __init__(self) -> None:
        self.seen: list[tuple[int, Outcome]] = []

    def __call__(self, record: RecordLike, outcome: Outcome) -> None:
        self.seen.append((record.offset, outcome))


async def _lanes(batcher: Batcher, groups: Sequence[Sequence[int]], report: _Reports,
                 abandon: asyncio.Event | None = None) -> list[asyncio.Task[None]]:
    flag = abandon or asyncio.Event()
    tasks = [asyncio.create_task(batcher.process(_records(*g), flag, report)) for g in groups]
    await asyncio.sleep(0)
    return tasks


async def test_groups_are_never_split_and_batches_fill_up_to_max_batch_in_order() -> None:
    fake = FakePipeline(concurrency=1)
    fake.gate.clear()
    batcher = _batcher(fake, max_batch=5)
    report = _Reports()
    tasks = await _lanes(batcher, [[1, 2], [3, 4], [5], [6, 7, 8, 9, 10], [11]], report)
    fake.gate.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert fake.batches == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11]]
    assert sorted(report.seen) == [(n, Outcome.APPLIED) for n in range(1, 12)]
    await batcher.close()


async def test_no_more_batches_run_at_once_than_the_pipeline_has_slots() -> None:
    fake = FakePipeline(concurrency=2)
    fake.gate.clear()
    batcher = _batcher(fake, max_batch=1)
    report = _Reports()
    tasks = await _lanes(batcher, [[n] for n in range(8)], report)
    for _ in range(20):
        await asyncio.sleep(0)
    assert fake.running == 2
    fake.gate.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert fake.peak == 2
    assert len(report.seen) == 8
    await batcher.close()


async def test_a_lane_cut_short_ends_its_batch_and_the_other_lanes_go_one_by_one() -> None:
    fake = FakePipeline(concurrency=1)
    fake.gate.clear()
    batcher = _batcher(fake, max_batch=10)
    report = _Reports()
    cut, kept = await _lanes(batcher, [[1, 2], [3]], report)
    for _ in range(20):
        await asyncio.sleep(0)
    assert fake.running == 1
    cut.cancel()
    await asyncio.gather(cut, return_exceptions=True)
    await asyncio.wait_for(kept, 5)
    assert fake.cancelled == 1
    assert fake.alone == [3]
    assert report.seen == [(3, Outcome.APPLIED)]
    s = fake.stats
    assert (s.delivered, s.applied, s.abandoned, s.batch_fallbacks) == (3, 1, 2, 1)
    await batcher.close()


async def test_an_abandoned_group_is_dropped_before_its_batch_and_counted() -> None:
    fake = FakePipeline(concurrency=1)
    await fake.slots.acquire()
    batcher = _batcher(fake, max_batch=10)
    report = _Reports()
    abandon = asyncio.Event()
    [lane] = await _lanes(batcher, [[1, 2, 3]], report, abandon)
    abandon.set()
    fake.slots.release()
    await asyncio.wait_for(lane, 5)
    assert fake.batches == []
    assert report.seen == []
    assert (fake.stats.delivered, fake.stats.abandoned) == (3, 3)
    await batcher.close()


async def test_close_cancels_running_batches_and_waiting_lanes() -> None:
    fake = FakePipeline(concurrency=1)
    fake.gate.clear()
    batcher = _batcher(fake, max_batch=1)
    report = _Reports()
    tasks = await _lanes(batcher, [[1], [2]], report)
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.wait_for(batcher.close(), 5)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, asyncio.CancelledError) for r in results)
    assert fake.cancelled == 1
    assert report.seen == []
    assert (fake.stats.delivered, fake.stats.abandoned) == (2, 2)


async def test_a_keys_groups_reach_batches_one_at_a_time_in_order() -> None:
    """Lanes hand the batcher one group at a time: two records of one key are never in two
    batches at once, and its batches follow the key's order, whatever the other keys do."""
    fake = FakePipeline(concurrency=4)
    batcher = _batcher(fake, max_batch=4)
    in_batch: dict[bytes, int] = {}
    overlap: list[bytes] = []
    original = fake.apply_batch

    async def watched(items: list[Decoded]) -> list[Claim]:
        keys = [d.envelope.offset % 3 for d in items]
        for key in {bytes([k]) for k in keys}:
            if in_batch.get(key):
                overlap.append(key)
            in_batch[key] = in_batch.get(key, 0) + 1
        try:
            for _ in range(3):
                await asyncio.sleep(0)
            return await original(items)
        finally:
            for key in {bytes([k]) for k in keys}:
                in_batch[key] -= 1

    fake.apply_batch = watched  # type: ignore[method-assign]
    report = _Reports()

    async def run(_key: Hashable, records: list[RecordLike]) -> None:
        await batcher.process(records, asyncio.Event(), report)

    executor: KeyedExecutor[RecordLike] = KeyedExecutor(run, 100, max_group=2)
    for n in range(60):
        executor.submit(n % 3, Record("t", 0, n, bytes([n % 3]), b"{}"))
    await asyncio.wait_for(executor.join(), 10)
    assert overlap == []
    for key in range(3):
        offsets = [n for batch in fake.batches for n in batch if n % 3 == key]
        assert offsets == list(range(key, 60, 3))
    assert len(report.seen) == 60
    await batcher.close()


async def test_a_batch_that_overruns_the_deadline_halves_the_batches_then_they_grow_back() -> None:
    fake = FakePipeline(concurrency=1)
    fake.handler_timeout = 60.0
    overrun = {1}  # the batch that starts at offset 1 overruns its deadline

    async def apply(items: list[Decoded]) -> list[Claim]:
        fake.batches.append([d.envelope.offset for d in items])
        if items[0].envelope.offset in overrun:
            raise TimeoutError
        return [Claim(ClaimStatus.CLAIMED) for _ in items]

    fake.apply_batch = apply  # type: ignore[method-assign]
    batcher = _batcher(fake, max_batch=8)
    limits: list[int] = []
    batcher.on_limit = limits.append
    report = _Reports()
    await asyncio.wait_for(asyncio.gather(*await _lanes(
        batcher, [[n] for n in range(1, 9)], report)), 5)
    assert fake.batches[0] == list(range(1, 9))
    assert fake.alone == list(range(1, 9))  # the overrun batch went one by one
    assert batcher.limit == 4
    assert limits == [4]
    # a full batch well within the deadline doubles the limit again, up to max_batch
    await asyncio.wait_for(asyncio.gather(*await _lanes(
        batcher, [[n] for n in range(10, 14)], report)), 5)
    assert fake.batches[-1] == [10, 11, 12, 13]
    assert batcher.limit == 8
    assert limits == [4, 8]
    await batcher.close()


# -- groups from task-less lanes (Batcher.submit) ---------------------------------------------


class _Owner:
    """The batcher's view of one partition's lanes, recording what it is told."""

    def __init__(self, lanes: KeyedLanes[RecordLike] | None = None) -> None:
        self.abandon = asyncio.Event()
        self.running: set[asyncio.Task[None]] = set()
        self.seen: list[tuple[int, Outcome]] = []
        self.finished_groups: list[list[int]] = []
        self.lanes = lanes

    def report(self, record: RecordLike, outcome: Outcome) -> None:
        self.seen.append((record.offset, outcome))

    def finished(self, lane: Hashable, records: list[RecordLike]) -> None:
        self.finished_groups.append([r.offset for r in records])
        if self.lanes is not None:
            self.lanes.done(lane)


def _submitted(batcher: Batcher, owner: _Owner, groups: Sequence[Sequence[int]]) -> None:
    for n, group in enumerate(groups):
        batcher.submit(n, _records(*group), owner)


async def test_submitted_groups_share_a_batch_without_a_task_each() -> None:
    fake = FakePipeline(concurrency=1)
    fake.gate.clear()
    batcher = _batcher(fake, max_batch=100)
    owner = _Owner()
    before = len(asyncio.all_tasks())
    _submitted(batcher, owner, [[n] for n in range(50)])
    await _until(lambda: fake.running == 1)
    # the gathering task and the one batch: no task per group
    assert len(asyncio.all_tasks()) - before == 2
    assert len(owner.running) == 1  # the batch, which a revocation would cancel
    fake.gate.set()
    await _until(lambda: len(owner.finished_groups) == 50)
    assert fake.batches == [list(range(50))]
    assert owner.seen == [(n, Outcome.APPLIED) for n in range(50)]
    assert owner.running == set()
    assert (fake.stats.delivered, fake.stats.applied) == (50, 50)
    await batcher.close()


async def test_a_lanes_next_group_waits_for_its_previous_one() -> None:
    fake = FakePipeline(concurrency=4)
    batcher = _batcher(fake, max_batch=3)
    owner = _Owner()
    lanes: KeyedLanes[RecordLike] = KeyedLanes(
        lambda lane, records: batcher.submit(lane, records, owner), max_group=2)
    owner.lanes = lanes
    for n in range(7):
        lanes.submit("k", _records(n)[0])
    lanes.submit("j", _records(100)[0])
    await asyncio.wait_for(lanes.join(), 5)
    # one group of the key at a time, in order, two records at most
    assert [g for g in owner.finished_groups if g[0] < 100] == [[0, 1], [2, 3], [4, 5], [6]]
    assert [n for batch in fake.batches for n in batch if n < 100] == list(range(7))
    assert len(owner.seen) == 8
    await batcher.close()


async def test_a_rolled_back_submitted_batch_falls_back_in_a_task_then_finishes() -> None:
    fake = FakePipeline(concurrency=1)

    async def failing(items: list[Decoded]) -> list[Claim]:
        fake.batches.append([d.envelope.offset for d in items])
        raise RuntimeError("the batch failed")

    fake.apply_batch = failing  # type: ignore[method-assign]
    batcher = _batcher(fake, max_batch=10)
    owner = _Owner()
    _submitted(batcher, owner, [[1, 2], [3]])
    await _until(lambda: len(owner.finished_groups) == 2)
    assert fake.alone == [1, 2, 3]
    assert sorted(owner.seen) == [(n, Outcome.APPLIED) for n in (1, 2, 3)]
    assert sorted(owner.finished_groups) == [[1, 2], [3]]
    assert fake.stats.batch_fallbacks == 1
    await _until(lambda: not owner.running)
    await batcher.close()


async def test_a_revocation_cuts_short_its_batch_and_the_other_partition_falls_back() -> None:
    fake = FakePipeline(concurrency=1)
    fake.gate.clear()
    batcher = _batcher(fake, max_batch=10)
    revoked, kept = _Owner(), _Owner()
    batcher.submit("a", _records(1, 2), revoked)
    batcher.submit("b", _on_partition_1(3), kept)
    await _until(lambda: fake.running == 1)
    revoked.abandon.set()
    for task in list(revoked.running):  # what PartitionState.kill does
        task.cancel()
    await _until(lambda: len(kept.finished_groups) == 1)
    assert fake.cancelled == 1
    assert revoked.seen == []  # nothing finished: its offsets stay where they were
    assert revoked.finished_groups == [[1, 2]]
    assert kept.seen == [(3, Outcome.APPLIED)]
    assert fake.alone == [3]
    s = fake.stats
    assert (s.delivered, s.applied, s.abandoned, s.batch_fallbacks) == (3, 1, 2, 1)
    await batcher.close()


async def test_a_sweep_gives_up_abandoned_groups_before_any_batch() -> None:
    fake = FakePipeline(concurrency=1)
    await fake.slots.acquire()  # no batch can start
    batcher = _batcher(fake, max_batch=10)
    revoked, kept = _Owner(), _Owner()
    batcher.submit("a", _records(1, 2), revoked)
    batcher.submit("b", _on_partition_1(3), kept)
    await asyncio.sleep(0)
    revoked.abandon.set()
    batcher.sweep()
    assert revoked.finished_groups == [[1, 2]]
    assert (fake.stats.delivered, fake.stats.abandoned) == (3, 2)
    fake.slots.release()
    await _until(lambda: kept.finished_groups == [[3]])
    assert fake.batches == [[3]]
    await batcher.close()


async def test_an_expired_record_of_a_submitted_group_waits_for_its_dead_letter() -> None:
    fake = FakePipeline(concurrency=1)
    expired = Claim(ClaimStatus.EXPIRED)

    async def apply(items: list[Decoded]) -> list[Claim]:
        return [expired if d.envelope.offset == 2 else Claim(ClaimStatus.CLAIMED)
                for d in items]

    def settled(claim: Claim, record: RecordLike, decoded: Decoded) -> Outcome | None:
        return None if claim is expired else Outcome.APPLIED

    letters: list[int] = []

    async def expired_dead_letter(record: RecordLike, decoded: Decoded, attempt: int,
                                  abandon: asyncio.Event) -> Outcome:
        await asyncio.sleep(0)
        letters.append(record.offset)
        return Outcome.DEAD_LETTERED

    fake.apply_batch = apply  # type: ignore[method-assign]
    fake.settled = settled  # type: ignore[method-assign]
    fake.unapplied.expired_dead_letter = expired_dead_letter  # type: ignore[attr-defined]
    batcher = _batcher(fake, max_batch=10)
    owner = _Owner()
    batcher.submit("k", _records(1, 2, 3), owner)
    await _until(lambda: owner.finished_groups == [[1, 2, 3]])
    assert owner.seen == [(1, Outcome.APPLIED), (2, Outcome.DEAD_LETTERED),
                          (3, Outcome.APPLIED)]
    assert letters == [2]
    assert fake.stats.abandoned == 0
    await batcher.close()


async def test_closing_abandons_submitted_groups_and_finishes_them() -> None:
    fake = FakePipeline(concurrency=1)
    fake.gate.clear()
    batcher = _batcher(fake, max_batch=1)
    owner = _Owner()
    _submitted(batcher, owner, [[1], [2]])
    await _until(lambda: fake.running == 1)
    await asyncio.wait_for(batcher.close(), 5)
    assert sorted(owner.finished_groups) == [[1], [2]]
    assert owner.seen == []
    assert (fake.stats.delivered, fake.stats.abandoned) == (2, 2)
    batcher.submit("late", _records(3), owner)  # after close: given up at once
    assert owner.finished_groups[-1] == [3]
    assert fake.stats.abandoned == 3


async def test_closing_cuts_short_a_fallback_and_finishes_its_group() -> None:
    fake = FakePipeline(concurrency=1)

    async def failing(items: list[Decoded]) -> list[Claim]:
        raise RuntimeError("the batch failed")

    hung = asyncio.Event()

    async def hang(record: RecordLike, decoded: Decoded, abandon: asyncio.Event,
                   failed: HandlerFailure | None = None) -> Outcome:
        hung.set()
        await asyncio.Event().wait()
        raise AssertionError("never")

    fake.apply_batch = failing  # type: ignore[method-assign]
    fake.process_decoded = hang  # type: ignore[method-assign]
    batcher = _batcher(fake, max_batch=10)
    owner = _Owner()
    batcher.submit("k", _records(1, 2), owner)
    await asyncio.wait_for(hung.wait(), 5)
    assert len(owner.running) == 1  # the fallback's task
    await asyncio.wait_for(batcher.close(), 5)
    assert owner.finished_groups == [[1, 2]]
    assert owner.seen == []
    assert (fake.stats.delivered, fake.stats.abandoned) == (2, 2)


async def test_an_error_in_a_groups_task_stops_its_lane_and_is_kept_for_the_engine() -> None:
    fake = FakePipeline(concurrency=1)

    async def failing(items: list[Decoded]) -> list[Claim]:
        raise RuntimeError("the batch failed")

    async def refusing(record: RecordLike, decoded: Decoded, abandon: asyncio.Event,
                       failed: HandlerFailure | None = None) -> Outcome:
        raise PermissionError("no grant on the parking table")

    fake.apply_batch = failing  # type: ignore[method-assign]
    fake.process_decoded = refusing  # type: ignore[method-assign]
    batcher = _batcher(fake, max_batch=10)
    owner = _Owner()
    batcher.submit("k", _records(1, 2), owner)
    await _until(lambda: bool(batcher.errors))
    await _until(lambda: not owner.running)
    assert isinstance(batcher.errors[0], PermissionError)
    assert owner.finished_groups == []  # its lane goes no further: nothing after it runs
    assert owner.seen == []
    await batcher.close()


async def test_tasks_cancelled_before_their_first_step_still_settle_their_groups() -> None:
    fake = FakePipeline(concurrency=2)
    applied: list[int] = []

    async def failing(items: list[Decoded]) -> list[Claim]:
        applied.extend(d.envelope.offset for d in items)
        raise RuntimeError("the batch failed")

    fake.apply_batch = failing  # type: ignore[method-assign]
    batcher = _batcher(fake, max_batch=10)
    revoked = _Owner()
    batcher.submit("a", _records(1), revoked)
    # the batch task is made, then cancelled by a revocation before it ever runs
    await _until(lambda: bool(revoked.running))
    assert applied == []
    revoked.abandon.set()
    for task in list(revoked.running):
        task.cancel()
    await _until(lambda: revoked.finished_groups == [[1]])
    assert applied == []
    assert fake.stats.abandoned == 1
    # a fallback task cancelled the same way: its group is finished all the same
    kept = _Owner()
    batcher.submit("b", _on_partition_1(2), kept)
    await _until(lambda: applied == [2] and bool(kept.running))
    kept.abandon.set()
    for task in list(kept.running):
        task.cancel()
    await _until(lambda: kept.finished_groups == [[2]])
    assert fake.alone == []  # the fallback never ran
    assert kept.seen == []
    await batcher.close()


def _on_partition_1(offset: int) -> list[RecordLike]:
    return [Record("t", 1, offset, b"k", b"{}")]


async def _until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0)
