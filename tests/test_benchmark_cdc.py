"""``python -m benchmarks.cdc --docs`` replaces its own section of the benchmarks page, once,
and the suite's page writer keeps it after every run's figures."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from benchmarks import cdc, docs


async def two_phases(args: argparse.Namespace) -> list[cdc.Phase]:
    return [cdc.Phase("relay (NOTIFY)", args.rows / 0.5, 1.5, 20.0, 575.0, 0.15),
            cdc.Phase("Debezium (delete after insert)", args.rows / 2.0, 540.0, 970.0,
                      556.0, 0.12)]


def test_the_section_is_written_once_and_replaced_by_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    page, section = tmp_path / "benchmarks.md", tmp_path / "cdc.md"
    page.write_text("# Benchmarks\n\n## Run\n\nfigures\n")
    monkeypatch.setattr(cdc, "PAGE", page)
    monkeypatch.setattr(cdc, "SECTION", section)
    cdc.main(["--rows", "1000", "--docs"], runner=two_phases)
    cdc.main(["--rows", "3000", "--docs"], runner=two_phases)
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\n## Run\n\nfigures\n")
    assert text.count(cdc.HEADING) == 1
    assert "| relay (NOTIFY) | 6,000 | 1.5 | 20.0 | 575 | 0.150 |" in text  # the second run
    assert "--rows 1000" not in text
    assert section.read_text() in text
    assert cdc.HEADING in capsys.readouterr().out


def test_the_suite_page_keeps_the_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          ) -> None:
    section = tmp_path / "cdc.md"
    section.write_text(f"{cdc.HEADING}\n\n| way out |\n")
    monkeypatch.setattr(docs, "CDC", section)
    monkeypatch.setattr(docs, "render", lambda document: "## Run\n")
    written = docs.write({"context": {"cpus": 2}}, tmp_path / "page.md").read_text()
    assert written.index("## Run") < written.index(cdc.HEADING)
