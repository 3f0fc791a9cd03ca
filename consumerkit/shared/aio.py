"""The event loop a runnable runs on: uvloop when it is installed (the ``fast`` extra) and not
turned off, else the standard asyncio loop.

uvloop is optional: nothing in consumerkit depends on it, it only makes the round trips to
PostgreSQL and the broker cheaper in CPU. ``CONSUMERKIT_UVLOOP=false`` (the ``uvloop``
setting) keeps the standard loop even when uvloop is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
from collections.abc import Callable, Coroutine
from importlib import metadata
from typing import Any, TypeVar

T = TypeVar("T")

LoopFactory = Callable[[], asyncio.AbstractEventLoop]

_FALSE = {"0", "false", "no", "off"}


def uvloop_factory() -> LoopFactory | None:
    """uvloop's ``new_event_loop``, or None when uvloop is not installed."""
    try:
        module = importlib.import_module("uvloop")
    except ImportError:
        return None
    factory: LoopFactory = module.new_event_loop
    return factory


def loop_factory(use_uvloop: bool = True) -> LoopFactory | None:
    """What ``asyncio.Runner(loop_factory=...)`` should take: uvloop's when wanted and
    installed, else None (the standard loop)."""
    return uvloop_factory() if use_uvloop else None


def wanted_from_environment() -> bool:
    """The ``uvloop`` setting read from ``CONSUMERKIT_UVLOOP`` alone, for entry points that
    have no settings model (the demo and its worker processes)."""
    return os.environ.get("CONSUMERKIT_UVLOOP", "true").strip().lower() not in _FALSE


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool = True) -> T:
    """``asyncio.run(main)`` on the loop :func:`loop_factory` chooses."""
    with asyncio.Runner(loop_factory=loop_factory(use_uvloop)) as runner:
        return runner.run(main)


async def wait_set(event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds have passed; whether it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
    return event.is_set()


def describe(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """The running (or given) loop in words, for logs and benchmark reports:
    ``uvloop 0.23.0`` or ``asyncio``."""
    loop = loop or asyncio.get_running_loop()
    if type(loop).__module__.split(".")[0] == "uvloop":
        try:
            return f"uvloop {metadata.version('uvloop')}"
        except metadata.PackageNotFoundError:
            return "uvloop"
    return "asyncio"


def report(use_uvloop: bool) -> str:
    """The running loop and why it is that one, for the start-up log line."""
    used = describe()
    if used != "asyncio":
        return used
    if not use_uvloop:
        return "asyncio (uvloop turned off)"
    return "asyncio (uvloop not installed)" if uvloop_factory() is None else "asyncio"
