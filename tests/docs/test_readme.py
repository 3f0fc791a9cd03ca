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
