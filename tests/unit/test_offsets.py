from hypothesis import given
from hypothesis import strategies as st

from consumerkit.offsets.watermark import PartitionOffsets


def test_watermark_waits_for_the_lowest_in_flight_offset() -> None:
    offsets = PartitionOffsets()
    for off in (10, 11, 12):
        offsets.started(off)
    assert offsets.committable() == 10
    offsets.finished(12)
    offsets.finished(11)
    assert offsets.committable() == 10  # 10 still in flight: never commit past it
    offsets.finished(10)
    assert offsets.committable() == 13


def test_nothing_new_after_a_commit() -> None:
    offsets = PartitionOffsets()
    offsets.started(0)
    offsets.finished(0)
    assert offsets.committable() == 1
    offsets.committed = 1
    assert offsets.committable() is None
    offsets.started(1)
    assert offsets.committable() is None


def test_gaps_in_offsets_are_skipped() -> None:
    offsets = PartitionOffsets()
    offsets.started(5)
    offsets.started(8)  # 6 and 7 are control records, never delivered
    offsets.finished(5)
    assert offsets.committable() == 8
    offsets.finished(8)
    assert offsets.committable() == 9


@given(st.permutations(list(range(30))), st.integers(min_value=0, max_value=29))
def test_watermark_never_passes_an_unfinished_offset(order: list[int], stop: int) -> None:
    offsets = PartitionOffsets()
    for off in range(30):
        offsets.started(off)
    finished = set(order[:stop])
    for off in order[:stop]:
        offsets.finished(off)
    expected = next(off for off in range(31) if off not in finished)
    assert offsets.committable() == expected
    assert offsets.in_flight == 30 - expected
