"""The offsets package on its own: imports that go one way, the watermark a transaction stores,
an ownership placed outside the log, and the setting that chooses the store."""

from __future__ import annotations

import ast
import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consumerkit.envelope import Record
from consumerkit.offsets.gaps import through
from consumerkit.offsets.state import PartitionState
from consumerkit.offsets.tracker import Tracker
from consumerkit.offsets.watermark import PartitionOffsets
from consumerkit.settings import ConsumerSettings
from consumerkit.stats import ConsumerStats
from consumerkit.transport.memory import MemoryBroker, MemorySource
from consumerkit.transport.source import Partition, Source

PACKAGE = Path(__file__).resolve().parents[2] / "consumerkit"


def imports(path: Path) -> set[str]:
    """The consumerkit modules ``path`` imports, TYPE_CHECKING imports included."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            name = f"{base}.{node.module}" if node.level and node.module else (
                base if node.level else node.module or "")
            found.add(name.removesuffix(".__init__"))
            found.update(f"{name}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {n for n in found if n.startswith("consumerkit")}


def graph() -> dict[str, set[str]]:
    modules = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
               .removesuffix(".__init__"): p for p in PACKAGE.rglob("*.py")}
    return {name: {i for i in imports(path) if i in modules and i != name}
            for name, path in modules.items()}


def cycle_through(edges: dict[str, set[str]], start: str) -> list[str] | None:
    """An import path from ``start`` back to itself, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in edges.get(node, ()):
            if nxt == start:
                return [*path, nxt]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_the_offset_modules_import_one_way() -> None:
    edges = graph()
    room = sorted(m for m in edges if m.startswith("consumerkit.offsets"))
    assert "consumerkit.offsets.tracker" in room
    for module in room:
        assert cycle_through(edges, module) is None, module
        # nothing of the engine above: the engine and the applier use the room, not back
        assert not {i for i in edges[module] if i in (
            "consumerkit.engine.runner", "consumerkit.engine.apply", "consumerkit.engine.pipeline",
            "consumerkit.engine.batch", "consumerkit.consumer")}, module


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycle_through({"a": {"b"}, "b": {"c"}, "c": {"a"}}, "a") == ["a", "b", "c", "a"]
    assert cycle_through({"a": {"b"}, "b": {"c"}, "c": set()}, "a") is None


def test_a_transactions_own_records_count_as_done_and_no_others() -> None:
    offsets = PartitionOffsets()
    for off in range(10, 20):
        offsets.started(off)
    offsets.finished(13)
    assert offsets.watermark({10, 11}) == 12  # 12 is in flight, another transaction's
    assert offsets.watermark({10, 11, 12}) == 14  # 13 done before: counted
    assert offsets.watermark(set(range(10, 20))) == 20
    assert offsets.watermark() == 10
    assert offsets.watermark({11}) == 10  # not its own lowest: nothing claimed


@given(st.lists(st.integers(0, 60), unique=True, min_size=1, max_size=40),
       st.data())
def test_the_watermark_with_own_records_is_the_one_after_they_finish(
        started: list[int], data: st.DataObject) -> None:
    """What a transaction stores equals the plain watermark once its records are done."""
    started.sort()
    done = data.draw(st.sets(st.sampled_from(started)))
    own = data.draw(st.sets(st.sampled_from(started)))
    offsets, after = PartitionOffsets(), PartitionOffsets()
    for off in started:
        offsets.started(off)
        after.started(off)
    for off in done:
        offsets.finished(off)
        after.finished(off)
    for off in own - done:
        after.finished(off)
    assert offsets.watermark(own) == after.watermark()


class Seeking:
    def seek(self, part: tuple[str, int], offset: int) -> None:
        pass


def test_an_ownership_whose_stored_offset_is_past_the_log_takes_where_the_client_went(
        caplog: pytest.LogCaptureFixture) -> None:
    state = PartitionState(("t", 0), start=1000, fetched=1000)
    state.offsets.stored = 1000
    records = [Record("t", 0, offset, b"k", b"{}") for offset in range(5)]
    with caplog.at_level(logging.WARNING, "consumerkit.consumer"):
        kept = through(("t", 0), state, records, cast(Source, Seeking()), ConsumerStats())
    assert list(kept) == records
    assert state.outside
    assert state.start == 0
    assert state.offsets.stored is None
    assert "the stored offset 1000 is outside the log" in caplog.text


def test_an_ownership_that_starts_at_its_stored_offset_is_not_outside() -> None:
    state = PartitionState(("t", 0), start=7, fetched=7)
    state.offsets.stored = 7
    records = [Record("t", 0, offset, b"k", b"{}") for offset in range(7, 10)]
    through(("t", 0), state, records, cast(Source, Seeking()), ConsumerStats())
    assert (state.outside, state.start, state.offsets.stored) == (False, 7, 7)


def test_the_offset_store_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ConsumerSettings().options()["offset_store"] == "postgres"
    monkeypatch.setenv("CONSUMERKIT_OFFSET_STORE", "kafka")
    assert ConsumerSettings().options()["offset_store"] == "kafka"
    monkeypatch.setenv("CONSUMERKIT_OFFSET_STORE", "redis")
    with pytest.raises(ValueError, match="offset_store"):
        ConsumerSettings()


class _Gated(MemorySource):
    """A member whose broker answers a commit only once ``answer`` is set."""

    def __init__(self, broker: MemoryBroker, topic: str) -> None:
        super().__init__(broker, topics=[topic], group_id="g", rebalance=_Quiet())
        self.sent = asyncio.Event()
        self.answer = asyncio.Event()

    async def commit(self, offsets: Mapping[Partition, int]) -> None:
        self.sent.set()
        await self.answer.wait()
        await super().commit(offsets)


class _Quiet:
    async def on_revoked(self, partitions: list[Partition]) -> None:
        pass

    async def on_assigned(self, partitions: list[Partition]) -> None:
        pass


async def test_a_commit_answered_after_a_new_ownership_began_is_not_stamped_on_it() -> None:
    """Owned anew while a commit was on its way (revoked and assigned, or rewound): the new
    ownership commits from its own offsets, never taking the old one's as done."""
    broker = MemoryBroker()
    broker.create_topic("orders")
    source = _Gated(broker, "orders")
    await source.start()
    await source.fetch(0, 1)  # the partition is assigned to it
    part: Partition = ("orders", 0)
    old = PartitionState(part)
    old.submitted(0)
    old.offsets.finished(0)
    states = {part: old}
    tracker = Tracker(states, ConsumerStats())
    tracker.source = source
    committing = asyncio.create_task(tracker.commit(list(states.values())))
    await asyncio.wait_for(source.sent.wait(), 10)
    new = states[part] = PartitionState(part)
    source.answer.set()
    assert await asyncio.wait_for(committing, 10)
    assert (old.offsets.committed, new.offsets.committed) == (1, None)
