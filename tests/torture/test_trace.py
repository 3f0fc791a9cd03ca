"""The trace of a lost record: the first commit past it, and its consumer's story, told from
log lines written by the engine's own offset trace."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

import pytest

from consumerkit.engine.fetch import trace_fetch
from consumerkit.envelope import Record
from consumerkit.offsets.gaps import through
from consumerkit.offsets.state import PartitionState
from consumerkit.stats import ConsumerStats
from consumerkit.transport.source import Source

from .trace import explain, late_starts, parse_position, read_logs, rereads

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _records(*offsets: int) -> list[Record]:
    return [Record("t", 1, offset, b"k", b"{}") for offset in offsets]


def _log(path: Path, stamped: list[tuple[str, str, str]]) -> None:
    path.write_text("".join(f"2026-11-24 06:{at},000 DEBUG {name}: {text}\n"
                            for at, name, text in stamped))


def test_the_engine_traces_a_jump_and_a_gap(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, "consumerkit.consumer.offsets"):
        trace_fetch(("t", 1), None, _records(40, 41))  # where it starts is not known
        trace_fetch(("t", 1), 42, _records(45, 46))
        trace_fetch(("t", 1), 47, _records(47, 49))
    assert caplog.messages == [
        "t/1: offsets jump from 42 to 45",
        "t/1: 2 records fetched between offsets 47 and 49",
    ]


def test_the_first_commit_past_a_lost_record_and_its_consumer_s_story(tmp_path: Path) -> None:
    offsets = "consumerkit.consumer.offsets"
    _log(tmp_path / "consumer-0.log", [
        ("00:01", "consumerkit.consumer", "assigned [('t', 1)]"),
        ("00:02", offsets, "t/1: first offset of this ownership 40"),
        ("00:03", offsets, "committed t/0:7 t/1:42"),
        ("00:05", offsets, "t/1: offsets jump from 42 to 45"),
        ("00:06", offsets, "committing t/1:46"),
    ])
    _log(tmp_path / "consumer-1.log", [
        ("00:04", offsets, "committed t/1:43"),  # another partition's commits: not these
        ("00:07", offsets, "committed t/1:50"),
    ])
    lines = read_logs(tmp_path)
    assert [line.at[-9:] for line in lines][:3] == ["00:01,000", "00:02,000", "00:03,000"]
    story = explain(lines, *parse_position("t/1:44"))
    assert story[0].startswith("t/1:44: first committed past by consumer-0 at ")
    assert story[0].endswith("(committing 46)")
    assert [line.split(" consumer-0 ")[1] for line in story[1:]] == [
        "assigned [('t', 1)]", "t/1: first offset of this ownership 40", "committed t/0:7 t/1:42",
        "t/1: offsets jump from 42 to 45", "committing t/1:46"]
    assert explain(lines, "t", 1, 50) == ["t/1:50: no commit went past it"]


def test_an_ownership_that_began_past_the_last_commit_is_listed(tmp_path: Path) -> None:
    offsets = "consumerkit.consumer.offsets"
    _log(tmp_path / "consumer-0.log", [
        ("00:01", offsets, "committed t/1:42"),
        ("00:02", offsets, "committing t/1:50"),  # sent, maybe landed: the process died
    ])
    _log(tmp_path / "consumer-1.log", [
        ("00:03", offsets, "t/1: first offset of this ownership 50"),  # from the sent one
        ("00:04", offsets, "committed t/1:52"),
        ("00:05", offsets, "t/1: first offset of this ownership 60 (committed: 52)"),
    ])  # 52..59 skipped
    [late] = late_starts(read_logs(tmp_path))
    assert late.endswith("consumer-1 t/1 began at 60, last commit 52 (consumer-1 at "
                         "2026-11-24 06:00:04,000)")


def test_gaps_read_again_what_second_reads_found_and_gaps_passed_are_counted(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Seeking:
        def seek(self, part: tuple[str, int], offset: int) -> None:
            pass

    state, stats = PartitionState(("t", 1)), ConsumerStats()
    state.fetched = 40
    source = cast(Source, Seeking())
    with caplog.at_level(logging.DEBUG, "consumerkit.consumer"):
        # the engine's own lines: a gap read again, which the second read fills (5
        # records), then a gap that stays
        through(("t", 1), state, _records(45, 46), source, stats)
        state.fetched = through(("t", 1), state, _records(*range(40, 47), 50),
                                source, stats)[-1].offset + 1
        through(("t", 1), state, _records(50), source, stats)
        # then markers the client named at 51 and 53-54: passed at once, not read again
        state.fetched = 51
        state.skipped.add([(51, 52), (53, 55)])
        through(("t", 1), state, _records(52, 55), source, stats)
    (tmp_path / "consumer-0.log").write_text("".join(
        f"2026-11-24 06:00:0{n},000 DEBUG {r.name}: {r.getMessage()}\n"
        for n, r in enumerate(caplog.records)))
    assert rereads(tmp_path) == (2, 5, 2)
    assert (stats.gap_rereads, stats.hidden_records, stats.gaps_explained) == (2, 5, 2)


def test_an_ownership_that_began_past_the_last_commit_and_read_it_again_is_not_listed(
        tmp_path: Path) -> None:
    offsets = "consumerkit.consumer.offsets"
    _log(tmp_path / "consumer-0.log", [
        ("00:01", offsets, "committed t/1:42"),
        ("00:02", offsets, "t/1: first offset of this ownership 45 (committed: 42)"),
        ("00:03", offsets, "t/1: offsets jump from 42 to 45"),
        ("00:04", offsets, "t/1: offsets missing from 42, read again"),
        ("00:05", offsets, "committed t/1:50"),
        ("00:06", offsets, "t/1: first offset of this ownership 55 (committed: unknown)"),
    ])
    [late] = late_starts(read_logs(tmp_path))
    assert " t/1 began at 55, last commit 50 " in late
