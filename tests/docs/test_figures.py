"""Figures stated in several places come from one source: the long torture runs' reports
(``docs/torture/*.json``). The tables of ``docs/torture-long.md`` are what
``python -m tests.torture.report`` prints for the reports each section links, and the totals
in the README, ``docs/index.md`` and ``docs/torture-long.md`` are computed from them here; a
new report, or a figure edited by hand, fails until every copy agrees. The pages' numbered
lists count 1, 2, 3, ... without a repeat."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.torture.report import combined

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LONG = DOCS / "torture-long.md"
REPORT_LINK = re.compile(r"\]\((torture/long-[\w-]+\.json)\)")
WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen", "twenty"]
BEFORE, SINCE = "The run", "On the code that reads a gap twice"


def flat(text: str) -> str:
    """``text`` with its line breaks as spaces: a figure may wrap anywhere."""
    return re.sub(r"\s+", " ", text)


def sections(text: str) -> dict[str, str]:
    """``{heading: body}`` of each ``## `` section."""
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def linked_reports(body: str) -> list[dict[str, Any]]:
    return [json.loads((DOCS / path).read_text()) for path in REPORT_LINK.findall(body)]


def totals(reports: list[dict[str, Any]]) -> tuple[int, int, int]:
    """(events, faults, runs)."""
    return (sum(r["events_committed"] for r in reports),
            sum(r["faults_total"] for r in reports), len(reports))


def millions(n: int, digits: int) -> str:
    return f"{n / 1e6:.{digits}f} million events"


def overall(reports: list[dict[str, Any]]) -> str:
    events, faults, runs = totals(reports)
    return f"{millions(events, 1)} and {faults:,} faults in {WORDS[runs]} runs"


@pytest.fixture(scope="module")
def groups() -> dict[str, list[dict[str, Any]]]:
    found = {heading: linked_reports(body) for heading, body in sections(LONG.read_text()).items()}
    return {heading: reports for heading, reports in found.items() if reports}


def test_every_report_is_linked_by_one_section(groups: dict[str, list[dict[str, Any]]]) -> None:
    linked = REPORT_LINK.findall(LONG.read_text())
    on_disk = sorted(f"torture/{p.name}" for p in (DOCS / "torture").glob("long-*.json"))
    assert sorted(linked) == on_disk  # each once: a report counted twice would be caught here
    assert set(groups) == {BEFORE, SINCE}


def test_each_table_is_the_report_of_its_runs(groups: dict[str, list[dict[str, Any]]]) -> None:
    bodies = sections(LONG.read_text())
    for heading, reports in groups.items():
        assert combined(reports) in bodies[heading], (
            f"the table under '## {heading}' is not what `python -m tests.torture.report` "
            "prints for the reports that section links")


def test_the_totals_agree_everywhere(groups: dict[str, list[dict[str, Any]]]) -> None:
    everything = [r for reports in groups.values() for r in reports]
    readme, index, long = (flat(p.read_text()) for p in (
        ROOT / "README.md", DOCS / "index.md", LONG))
    phrase = overall(everything)
    for where, text in (("README.md", readme), ("docs/index.md", index),
                        ("docs/torture-long.md", long)):
        assert phrase in text, f"{where} does not say '{phrase}'"

    before, since = groups[BEFORE], groups[SINCE]
    failed = sum(not r["verdict"] for r in before)
    assert f"in {WORDS[failed]} of the first {WORDS[len(before)]} runs" in readme
    events, faults, runs = totals(since)
    assert all(r["verdict"] for r in since)
    assert f"the {WORDS[runs]} runs since ({millions(events, 2)}, {faults:,} faults)" in readme
    assert f"Together they make {events:,} events and {faults:,} faults" in long
    assert f"These {WORDS[len(before)]} runs came before" in long
    kinds = {r["fault_kinds"] for r in everything}
    assert len(kinds) == 1
    assert f"under {kinds.pop()} kinds of seeded faults" in readme


KAFKA = "On Apache Kafka: `kafka-long`"
KAFKA_LINK = re.compile(r"\]\((torture/kafka-long-[\w-]+\.json)\)")


def test_the_kafka_runs_table_and_totals_come_from_their_reports() -> None:
    body = sections(LONG.read_text())[KAFKA]
    linked = KAFKA_LINK.findall(body)
    on_disk = sorted(f"torture/{p.name}" for p in (DOCS / "torture").glob("kafka-long-*.json"))
    assert sorted(linked) == on_disk
    reports = [json.loads((DOCS / path).read_text()) for path in linked]
    assert combined(reports) in body
    events, faults, runs = totals(reports)
    assert f"Together: {events:,} events and {faults:,} faults" in flat(body)
    phrase = f"{millions(events, 1)} and {faults:,} faults in {WORDS[runs]} runs"
    for page in (ROOT / "README.md", DOCS / "index.md"):
        assert phrase in flat(page.read_text()), f"{page.name} does not say '{phrase}'"


def test_a_changed_figure_is_caught(groups: dict[str, list[dict[str, Any]]]) -> None:
    everything = [r for reports in groups.values() for r in reports]
    one_more = [*everything, {**everything[0], "events_committed": 400_000}]
    assert overall(one_more) != overall(everything)
    assert overall(one_more) not in flat((ROOT / "README.md").read_text())


def numbered_lists(text: str) -> list[list[int]]:
    """The numbers of each numbered list: a list ends at a line of its own that is not an
    item, an item's indented continuation, or blank."""
    lists: list[list[int]] = [[]]
    for line in text.splitlines():
        item = re.match(r"(\d+)\. ", line)
        if item:
            lists[-1].append(int(item.group(1)))
        elif line.strip() and not line.startswith(" ") and lists[-1]:
            lists.append([])
    return [numbers for numbers in lists if numbers]


def test_numbered_lists_count_without_repeats() -> None:
    assert numbered_lists("1. a\n2. b\n   more\n\n2. c\ntext\n1. d\n") == [[1, 2, 2], [1]]
    for page in (ROOT / "README.md", *DOCS.rglob("*.md")):
        for numbers in numbered_lists(page.read_text()):
            assert numbers == list(range(1, len(numbers) + 1)), f"{page.name}: {numbers}"
