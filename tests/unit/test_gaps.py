"""A fetch is taken up to its first gap that the fetch before did not show too, nor the
source explained (transaction markers, aborted transactions)."""

from __future__ import annotations

from consumerkit.envelope import Record
from consumerkit.offsets.sighting import Sighting, unbroken
from consumerkit.offsets.skipped import LIMIT, Skipped


def fetch(*offsets: int) -> list[Record]:
    return [Record(topic="t", partition=0, offset=o, key=b"k", value=b"", headers=(),
                   timestamp=0) for o in offsets]


def sighting(start: int, *offsets: int) -> Sighting:
    return Sighting(start, list(offsets))


def test_contiguous_records_are_taken_whole() -> None:
    assert unbroken(fetch(4, 5, 6), 4, None) == (3, None, 0)
    assert unbroken(fetch(), 4, None) == (0, None, 0)


def test_an_ownerships_first_fetch_starts_where_the_broker_says() -> None:
    assert unbroken(fetch(9, 10), None, None) == (2, None, 0)
    assert unbroken(fetch(9, 11), None, None) == (1, 10, 0)  # a gap inside it still counts


def test_a_new_gap_stops_the_fetch_where_it_starts() -> None:
    assert unbroken(fetch(4, 5, 9, 10), 4, None) == (2, 6, 0)
    assert unbroken(fetch(7, 8), 4, None) == (0, 4, 0)  # a gap before the first record


def test_a_gap_the_fetch_before_showed_is_passed() -> None:
    seen = sighting(6, 9, 10)
    assert unbroken(fetch(9, 10, 11), 6, seen) == (3, None, 0)
    assert unbroken(fetch(5, 9, 10), 5, seen) == (3, None, 0)


def test_a_gap_the_second_read_shows_differently_is_read_again() -> None:
    seen = sighting(6, 9, 10)
    # the broker had hidden 6 and 7; 8 is missing from both reads
    assert unbroken(fetch(6, 7, 9, 10), 6, seen) == (4, None, 0)
    # a later gap than the one seen: read again from it too
    assert unbroken(fetch(9, 10, 12), 6, seen) == (2, 11, 0)
    # a gap where the first read had a record
    assert unbroken(fetch(6, 7, 8, 10), 6, sighting(6, 8, 9, 10)) == (3, 9, 0)


def test_a_gap_past_what_was_seen_is_not_vouched_for() -> None:
    seen = sighting(6, 9, 10)
    assert not seen.agrees(11, 14)  # 14 was never seen
    assert not seen.agrees(5, 9)  # the first read began at 6: 5 was not seen missing
    assert seen.agrees(6, 9)
    assert seen.agrees(8, 9)
    assert sighting(6, 9, 12).agrees(10, 12)  # 10 and 11 were missing then too


def test_the_records_a_second_read_adds_are_counted_as_hidden() -> None:
    seen = sighting(6, 9, 10, 14)
    assert seen.filled(fetch(6, 7, 8, 9, 10, 11, 12)) == 5  # 6, 7, 8, 11, 12
    assert seen.filled(fetch(9, 10, 14, 15)) == 0  # 15 lies past the first read
    assert sighting(6).filled(fetch(6, 7)) == 0


def test_a_second_read_past_all_the_first_held_is_a_reset_position() -> None:
    # offset 6 out of range (retention), the client's position reset to the log's end twice:
    # a broker never hides records it has shown, so the second read is not a hiding broker
    assert unbroken(fetch(20, 21), 6, sighting(6, 9, 10)) == (2, None, 0)
    assert unbroken(fetch(20, 21), 7, sighting(6, 9, 10)) == (0, 7, 0)  # not from the gap


def skipped(*ranges: tuple[int, int]) -> Skipped:
    kept = Skipped()
    kept.add(ranges)
    return kept


def test_a_gap_the_source_explained_is_passed_at_once() -> None:
    markers = skipped((5, 6), (9, 11))
    assert unbroken(fetch(3, 4, 6, 7, 8, 11), 3, None, markers) == (6, None, 2)
    assert unbroken(fetch(6, 7), 5, None, markers) == (2, None, 1)  # before the first record


def test_a_gap_only_partly_explained_is_read_again() -> None:
    # 9-10 a marker and an aborted batch, 11 missing for no reason given: hidden, maybe
    assert unbroken(fetch(7, 8, 12), 7, None, skipped((9, 11))) == (2, 9, 0)
    assert unbroken(fetch(7, 8, 12), 7, None, skipped((10, 12))) == (2, 9, 0)
    # an explained gap passed, then one that is not: read again from that one
    assert unbroken(fetch(4, 6, 9), 4, None, skipped((5, 6))) == (2, 7, 1)


def test_skipped_ranges_merge_and_are_forgotten_once_read_past() -> None:
    kept = skipped((10, 12), (5, 6), (6, 8), (12, 13), (20, 21))
    assert [kept.covers(*r) for r in [(5, 8), (10, 13), (20, 21)]] == [True] * 3
    assert [kept.covers(*r) for r in [(5, 9), (8, 10), (4, 6)]] == [False] * 3
    assert len(kept) == 3
    kept.add([(7, 11)])  # overlapping: one range
    assert kept.covers(5, 13)
    assert len(kept) == 2
    kept.forget(13)
    assert (kept.covers(5, 6), kept.covers(20, 21)) == (False, True)
    assert len(kept) == 1


def test_skipped_keeps_its_newest_ranges_within_its_limit() -> None:
    kept = skipped(*((2 * n, 2 * n + 1) for n in range(LIMIT + 10)))
    assert len(kept) == LIMIT
    assert not kept.covers(0, 1)  # forgotten: that gap would be read again
    assert kept.covers(2 * (LIMIT + 9), 2 * (LIMIT + 9) + 1)
