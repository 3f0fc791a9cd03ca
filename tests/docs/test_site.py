"""The docs build (``scripts/docs.sh``, what ``scripts/test.sh`` and CI run) fails on any
warning: a copy of the site builds clean, and the same copy with a page left out of the nav,
or with a link to a file the site does not have, fails and says why. ``--quiet`` once hid
such warnings from ``--strict``, and the build passed with both."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# what the build reads: the config, the pages, the hooks and what they bring in, the package
# the API reference is generated from
PARTS = ["mkdocs.yml", "docs", "scripts", "examples", "consumerkit", "benchmarks/README.md"]


def build(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(root / "scripts" / "docs.sh"), str(root)], capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}, timeout=300, check=False)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in PARTS:
        source, target = ROOT / part, tmp_path / part
        if source.is_dir():
            shutil.copytree(source, target, ignore=ignore)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return tmp_path


def test_the_docs_build_without_a_warning(site: Path) -> None:
    result = build(site)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stderr
    assert (site / "site" / "service" / "index.html").exists()


def test_a_page_outside_the_nav_fails_the_build(site: Path) -> None:
    (site / "docs" / "stray.md").write_text("# Stray\n\nA page nobody put in the nav.\n")
    result = build(site)
    assert result.returncode != 0
    assert "not included in the \"nav\" configuration" in result.stderr
    assert "stray.md" in result.stderr


def test_a_link_to_a_missing_file_fails_the_build(site: Path) -> None:
    testing = site / "docs" / "testing.md"
    testing.write_text(testing.read_text() + "\nSee [the notes](notes/missing.md).\n")
    result = build(site)
    assert result.returncode != 0
    assert "'notes/missing.md', but the target is not found" in result.stderr


def test_the_test_script_builds_the_docs_with_this_script() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    commands = [line.strip() for line in script.splitlines()
                if line.strip() and not line.lstrip().startswith(("#", "echo"))]
    assert "bash scripts/docs.sh" in commands
    assert not [c for c in commands if "mkdocs" in c]  # no second build that could hide one
    assert "--quiet" not in (ROOT / "scripts" / "docs.sh").read_text().split("\nset ")[1]
