"""Paths and tools for the operations tests: the alert rules, their promtool unit tests, and
Debian's ``prometheus`` package (``prometheus`` and ``promtool``), skipped with the reason when
it is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ..integration.conftest import ledger_topic

__all__ = ["ledger_topic"]

ROOT = Path(__file__).resolve().parents[2]
OPERATIONS = ROOT / "docs" / "operations"
ALERTS = OPERATIONS / "alerts.yml"
UNIT_TESTS = Path(__file__).resolve().parent / "alerts_test.yml"
TOOL_TIMEOUT = 60.0


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed: it comes with Debian's prometheus package "
                    "(apt-get install prometheus), which .ci/run installs")
    return path


def promtool() -> str:
    return _tool("promtool")


def prometheus() -> str:
    return _tool("prometheus")


def run_tool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT,
                          check=False, cwd=ROOT)
