"""Offsets a fetch leaves out: the consumer reads them again before it commits past them.

A source stands in for a broker whose fetches leave offsets out, some once (a broker that had
not yet written the batch under its high watermark, as Tansu 0.6.0 does; docs/torture-long.md,
finding 4), some for good (transaction markers, compaction). The engine, pipeline and dedup
store are the production ones, on a real PostgreSQL; the seam is the ``Source`` protocol."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import asyncpg
import pytest

from consumerkit import Limits, Postgres
from consumerkit.engine.runner import Engine
from consumerkit.envelope import RecordLike
from consumerkit.errors import TransportError
from consumerkit.testing import TestConsumer
from consumerkit.transport.source import Partition, RebalanceHandler, Source

from ..testing.handlers import TABLE_SQL, Step, effects, registry


class LeavingOut:
    """A source whose fetches leave out the offsets in ``once`` the first time they come up,
    and those in ``always`` and ``marked`` every time; ``marked`` ones it says it skipped
    (:meth:`skipped`), as a Kafka client does with transaction markers."""

    inner: Source  # the consumer's source, given when the consumer makes it
    topics: list[str]

    def __init__(self, once: set[int], always: set[int],
                 committed_fails: bool = False, marked: frozenset[int] = frozenset()) -> None:
        self.once = set(once)
        self.committed_fails = committed_fails
        self.always = set(always) | marked
        self.marked = marked
        self.seeks: list[int] = []
        self._skipped: dict[Partition, list[tuple[int, int]]] = {}

    async def start(self) -> None:
        self.topics = self.inner.topics
        await self.inner.start()

    async def fetch(self, timeout_ms: int, max_records: int) -> dict[Partition, list[RecordLike]]:
        fetched = await self.inner.fetch(timeout_ms, max_records)
        kept: dict[Partition, list[RecordLike]] = {}
        for part, records in fetched.items():
            hidden = {r.offset for r in records} & self.once
            self.once -= hidden
            self._skipped.setdefault(part, []).extend(
                (r.offset, r.offset + 1) for r in records
                if r.offset in self.marked and r.offset not in hidden)
            if left := [r for r in records
                        if r.offset not in hidden and r.offset not in self.always]:
                kept[part] = left
        return kept

    def skipped(self) -> Mapping[Partition, Sequence[tuple[int, int]]]:
        taken, self._skipped = self._skipped, {}
        return taken

    def pause(self, paused: bool) -> None:
        self.inner.pause(paused)

    def seek(self, part: Partition, offset: int) -> None:
        self.seeks.append(offset)
        self.inner.seek(part, offset)

    async def commit(self, offsets: Mapping[Partition, int]) -> None:
        await self.inner.commit(offsets)

    async def end_offsets(self, parts: Sequence[Partition]) -> dict[Partition, int]:
        return await self.inner.end_offsets(parts)

    async def committed(self, part: Partition) -> int | None:
        if self.committed_fails:
            raise TransportError("cannot read the committed offset: the coordinator moved")
        return await self.inner.committed(part)

    async def stop(self) -> None:
        await self.inner.stop()


@pytest.fixture
async def effects_table(consumerkit_dsn: str) -> None:
    conn = await asyncpg.connect(consumerkit_dsn)
    try:
        await conn.execute(TABLE_SQL)
    finally:
        await conn.close()


async def run(dsn: str, schema: str, max_batch: int, once: set[int], always: set[int],
              later: int = 0, marked: frozenset[int] = frozenset(),
              ) -> tuple[TestConsumer, LeavingOut, list[tuple[str, int]]]:
    """Publish 30 steps of 3 keys to one partition, drain through a source that leaves
    offsets out, publish ``later`` steps more and drain again; return the kit, the source
    and the effects."""
    kit = TestConsumer([registry],
                       postgres=Postgres(dsn=dsn, schema=schema),
                       limits=Limits(max_batch=max_batch),
                       partitions=1)
    source = leaving_out(kit, once, always, marked=marked)
    publish(kit, range(30))  # before the start: the first fetch holds them all
    async with kit:
        await kit.drain()
        publish(kit, range(30, 30 + later))
        await kit.drain()
    return kit, source, await effects(dsn)


def leaving_out(kit: TestConsumer, once: set[int], always: set[int],
                committed_fails: bool = False, marked: frozenset[int] = frozenset(),
                ) -> LeavingOut:
    """Have ``kit``'s consumer read through a :class:`LeavingOut` source (returned)."""
    made = LeavingOut(once, always, committed_fails, marked)

    def source(rebalance: RebalanceHandler) -> Source:
        assert isinstance(rebalance, Engine)
        made.inner = kit.broker.source(topics=kit.consumer.topics,
                                       group_id=kit.consumer.name, rebalance=rebalance)
        return made

    kit.consumer.source_factory = source
    return made


def publish(kit: TestConsumer, seqs: range) -> None:
    for n in seqs:
        kit.publish(Step(key=f"k{n % 3}", seq=n), key=f"k{n % 3}")


@pytest.mark.parametrize("max_batch", [1, 500])
async def test_records_a_fetch_left_out_once_are_read_again_and_applied(
    consumerkit_dsn: str, consumerkit_schema: str, effects_table: None, max_batch: int,
) -> None:
    # 7-9 inside the fetch; 29 at its end comes back with the second read from 7
    kit, source, effects = await run(consumerkit_dsn, consumerkit_schema, max_batch,
                                     once={7, 8, 9, 29}, always=set())
    assert sorted(effects, key=lambda e: e[1]) == [(f"k{n % 3}", n) for n in range(30)]
    for key in ("k0", "k1", "k2"):  # each key in order
        seqs = [seq for k, seq in effects if k == key]
        assert seqs == sorted(seqs)
    assert source.seeks == [7]
    assert kit.stats.gap_rereads == 1
    assert kit.stats.hidden_records == 3
    assert kit.stats.applied == 30
    assert kit.committed == {("events", 0): 30}


async def test_records_hidden_at_the_start_of_a_later_fetch_are_read_again(
    consumerkit_dsn: str, consumerkit_schema: str, effects_table: None,
) -> None:
    # the first fetch ends at 29; the next one begins at 32 (the jump seen in the torture)
    kit, source, effects = await run(consumerkit_dsn, consumerkit_schema, 500,
                                     once={30, 31}, always=set(), later=10)
    assert sorted(seq for _, seq in effects) == list(range(40))
    assert source.seeks == [30]
    assert kit.stats.hidden_records == 2
    assert kit.committed == {("events", 0): 40}


@pytest.mark.parametrize("max_batch", [1, 500])
async def test_offsets_two_reads_agree_are_missing_are_passed_and_committed(
    consumerkit_dsn: str, consumerkit_schema: str, effects_table: None, max_batch: int,
) -> None:
    kit, source, effects = await run(consumerkit_dsn, consumerkit_schema, max_batch,
                                     once=set(), always={4, 5, 17})
    assert sorted(seq for _, seq in effects) == [n for n in range(30) if n not in {4, 5, 17}]
    assert source.seeks == [4]  # the second read also vouches for 17's gap
    assert kit.stats.gap_rereads == 1
    assert kit.stats.hidden_records == 0
    assert kit.committed == {("events", 0): 30}


@pytest.mark.parametrize("max_batch", [1, 500])
async def test_offsets_the_source_says_it_skipped_are_passed_without_a_second_read(
    consumerkit_dsn: str, consumerkit_schema: str, effects_table: None, max_batch: int,
) -> None:
    # 30 at the start of the second fetch, before its first record
    kit, source, effects = await run(consumerkit_dsn, consumerkit_schema, max_batch,
                                     once=set(), always=set(), later=5,
                                     marked=frozenset({4, 5, 17, 30}))
    assert sorted(seq for _, seq in effects) == [
        n for n in range(35) if n not in {4, 5, 17, 30}]
    assert source.seeks == []
    assert (kit.stats.gap_rereads, kit.stats.gaps_explained) == (0, 3)
    assert kit.committed == {("events", 0): 35}


async def test_a_hidden_record_beside_a_skipped_offset_is_still_read_again(
    consumerkit_dsn: str, consumerkit_schema: str, effects_table: None,
) -> None:
    # 7 a marker the source names; 8 and 9 hidden once: the gap 7-9 is not all explained
    kit, source, effects = await run(consumerkit_dsn, consumerkit_schema, 500,
                                     once={8, 9}, always=set(), marked=frozenset({7}))
    assert sorted(seq for _, seq in effects) == [n for n in range(30) if n != 7]
    assert source.seeks == [7]
    assert (kit.stats.gap_rereads, kit.stats.hidden_records) == (1, 2)
    assert kit.committed == {("events", 0): 30}


async def test_a_gap_at_the_first_offset_of_an_ownership_is_read_again(
    consumerkit_dsn: str, consumerkit_schema: str, effects_table: None,
) -> None:
    first, _, _ = await run(consumerkit_dsn, consumerkit_schema, 500, once=set(),
                            always=set())
    # another member of the group starts where the first committed: 30
    kit = TestConsumer([registry],
                       postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                       broker=first.broker)
    source = leaving_out(kit, once={30, 31}, always=set())
    publish(kit, range(30, 40))
    async with kit:
        await kit.drain()
    assert sorted(seq for _, seq in await effects(consumerkit_dsn)) == list(range(40))
    assert source.seeks == [30]
    assert kit.stats.hidden_records == 2


async def test_without_the_committed_offset_an_ownerships_first_fetch_is_taken_as_it_came(
    consumerkit_dsn: str, consumerkit_schema: str, effects_table: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    kit = TestConsumer([registry],
                       postgres=Postgres(dsn=consumerkit_dsn, schema=consumerkit_schema),
                       partitions=1)
    source = leaving_out(kit, once=set(), always=set(), committed_fails=True)
    publish(kit, range(10))
    with caplog.at_level(logging.WARNING, "consumerkit.consumer"):
        async with kit:
            await kit.drain()
    assert sorted(seq for _, seq in await effects(consumerkit_dsn)) == list(range(10))
    assert source.seeks == []
    assert [r.getMessage() for r in caplog.records if r.name == "consumerkit.consumer"] == [
        "events/0: cannot read the committed offset (TransportError('cannot read the "
        "committed offset: the coordinator moved')): the first fetch of this ownership is "
        "taken as it came"]
