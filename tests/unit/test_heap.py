"""The collector's tuning for a long-running process: what it changes, and that it never
lowers a threshold someone raised further."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from consumerkit.shared import heap


@pytest.fixture
def restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_tune_gc_freezes_start_up_and_raises_the_young_threshold(restored: None) -> None:
    gc.set_threshold(700, 10, 10)
    alive: list[object] = [object() for _ in range(10)]  # something start-up would keep
    said = heap.tune_gc()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, 10, 10)
    assert f"every {heap.YOUNG_THRESHOLD:,} allocations" in said
    assert f"{gc.get_freeze_count():,} start-up objects frozen" in said
    assert "objects frozen" in heap.describe()
    assert alive


def test_tune_gc_keeps_a_higher_threshold(restored: None) -> None:
    gc.set_threshold(heap.YOUNG_THRESHOLD * 4, 20, 30)
    heap.tune_gc()
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD * 4, 20, 30)


def test_cycles_are_still_collected_after_tuning(restored: None) -> None:
    heap.tune_gc()

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    assert gc.collect() >= 2
