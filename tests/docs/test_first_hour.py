"""docs/first-hour.md, typed as it stands by :mod:`tests.docs.first_hour`, with this
checkout's ``consumerkit`` first on PATH."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from .first_hour import first_hour

PAGE = Path(__file__).resolve().parents[2] / "docs" / "first-hour.md"


def test_the_first_hour_page_works_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    for name in [n for n in os.environ if n.startswith("CONSUMERKIT_")]:
        monkeypatch.delenv(name)
    first_hour(PAGE, tmp_path)
