"""The event loop choice: uvloop when installed and wanted, the standard loop otherwise."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from consumerkit.shared import aio

UVLOOP = importlib.util.find_spec("uvloop") is not None


async def _running() -> str:
    return aio.describe()


def test_turned_off_runs_the_standard_loop() -> None:
    assert aio.loop_factory(use_uvloop=False) is None
    assert aio.run(_running(), use_uvloop=False) == "asyncio"


@pytest.mark.skipif(not UVLOOP, reason="uvloop is not installed (the fast extra)")
def test_wanted_and_installed_runs_uvloop() -> None:
    assert aio.run(_running()).startswith("uvloop ")


@pytest.mark.skipif(UVLOOP, reason="uvloop is installed")
def test_wanted_but_not_installed_runs_the_standard_loop() -> None:
    assert aio.loop_factory() is None
    assert aio.run(_running()) == "asyncio"


def test_report_says_why_the_standard_loop_runs() -> None:
    async def report(wanted: bool) -> str:
        return aio.report(wanted)

    assert asyncio.run(report(False)) == "asyncio (uvloop turned off)"
    expected = "asyncio" if UVLOOP else "asyncio (uvloop not installed)"
    assert asyncio.run(report(True)) == expected


@pytest.mark.parametrize(("value", "wanted"), [
    (None, True), ("true", True), ("1", True), ("false", False), ("0", False), (" Off ", False)])
def test_the_environment_variable_turns_it_off(
    monkeypatch: pytest.MonkeyPatch, value: str | None, wanted: bool,
) -> None:
    if value is None:
        monkeypatch.delenv("CONSUMERKIT_UVLOOP", raising=False)
    else:
        monkeypatch.setenv("CONSUMERKIT_UVLOOP", value)
    assert aio.wanted_from_environment() is wanted
