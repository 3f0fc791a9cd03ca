"""The README's relative links lead somewhere: pages move (docs/operations.md became a
folder), and the README is the first page a newcomer reads."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s:]+)(?:#([^)\s]*))?\)")


def test_every_relative_link_of_the_readme_exists() -> None:
    text = (ROOT / "README.md").read_text()
    targets = [m.group(1) for m in LINK.finditer(text)]
    assert targets, "the README links nothing"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []


def opening_words(text: str) -> int:
    """Words between the title and the first code block."""
    before_code = text.split("```", 1)[0]
    return len(before_code.split("\n", 1)[1].split())


def test_the_readme_says_what_and_why_briefly_then_shows_code() -> None:
    text = (ROOT / "README.md").read_text()
    assert opening_words(text) < 100
    assert text.index("```python") < text.index("## Tortured on every CI run")


def test_the_check_counts_the_opening() -> None:
    assert opening_words("# title\n\none two three\n\n```python\nx = 1\n```\n") == 3
