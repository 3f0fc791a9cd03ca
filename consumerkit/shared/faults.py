"""Fail-points and deliberately broken variants ("mutants") for the torture test, behind one
hook: :func:`inject`.

Production code calls ``faults.inject(name)`` where a fault may happen, one call shape for
both kinds: at a fail-point (``faults.inject("before_commit")``) and where a mutant would
break the code (``if faults.inject("claim_skipped"): ...``). By default the hook does nothing
and returns False. Only when ``CONSUMERKIT_TORTURE`` is set as this module is first imported
is it switched on (``ON``): the value (JSON) names the mutant to run, if any, the file a test
writes a fail-point name to before sending ``SIGUSR1``, and (``arm``) a fail-point armed from
the start. The process kills itself with SIGKILL the next time it passes that point (or stops
itself, for a point armed as ``name:stop``).

Fail-points: ``after_claim``, ``before_commit``, ``after_commit``, ``after_cache_write``
(:mod:`consumerkit.engine.apply`), ``relay_after_publish`` (the outbox relay).

Mutants (each must be caught by the torture checker):

- ``offset_before_commit``: a record's offset may be committed as soon as it is dispatched;
- ``claim_skipped``: the dedup claim claims without recording anything;
- ``claim_outside_tx``: the claim commits on a connection of its own, before the handler;
- ``claim_no_wait``: the claim does not wait for a concurrent claim of its ids: two
  concurrent copies of an id are both claimed;
- ``cache_before_commit``: the Redis cache remembers an id before its transaction commits;
- ``lanes_ignore_key``: records go to lanes round-robin, whatever their key;
- ``relay_cursor``: the relay reads only rows above the highest seq it has read.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType

__all__ = ["MUTANTS", "ON", "POINTS", "inject"]

MUTANTS = (
    "offset_before_commit", "claim_skipped", "claim_outside_tx", "claim_no_wait",
    "cache_before_commit", "lanes_ignore_key", "relay_cursor",
)
POINTS = (
    "after_claim", "before_commit", "after_commit", "after_cache_write", "relay_after_publish",
)


class Torture:
    """The hook switched on: a mutant to run, a fail-point armed (by ``SIGUSR1`` with
    ``arm_file``)."""

    def __init__(self, config: dict[str, str]) -> None:
        self.config = config
        self.mutant = config.get("mutant", "")
        if self.mutant and self.mutant not in MUTANTS:
            raise ValueError(f"CONSUMERKIT_TORTURE: unknown mutant {self.mutant!r}")
        self.armed = config.get("arm", "")

    def __call__(self, name: str) -> bool:
        """For a mutant, whether this process runs it. For a fail-point: die at once
        (SIGKILL, no clean-up) if it is armed; armed as ``name:stop``, freeze there instead
        (SIGSTOP, once), a zombie in the middle of its work until the test sends SIGCONT."""
        if name in MUTANTS:
            return self.mutant == name
        if name not in POINTS:
            raise ValueError(f"unknown fail-point or mutant {name!r}")
        if self.armed == name:
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.armed == f"{name}:stop":
            self.armed = ""
            os.kill(os.getpid(), signal.SIGSTOP)
        return False

    def arm(self, signum: int, frame: FrameType | None) -> None:
        """``SIGUSR1``: arm the fail-point the test wrote to ``arm_file`` (none if empty)."""
        try:
            self.armed = Path(self.config["arm_file"]).read_text().strip()
        except (KeyError, OSError):
            self.armed = self.config.get("arm", "")


def _inert(name: str) -> bool:
    return False


_raw = os.environ.get("CONSUMERKIT_TORTURE", "")
ON = bool(_raw)
_torture = Torture(json.loads(_raw)) if ON else None

inject: Callable[[str], bool] = _torture if _torture is not None else _inert
"""The hook: a no-op returning False unless the torture switched it on (see above)."""

if _torture is not None and "arm_file" in _torture.config:
    signal.signal(signal.SIGUSR1, _torture.arm)
