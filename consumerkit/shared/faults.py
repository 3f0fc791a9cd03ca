"""Fail-points and deliberately broken variants ("mutants") for the torture test.

Everything here is inert unless ``CONSUMERKIT_TORTURE`` is set when this module is first
imported: then ``ON`` is true and the value (JSON) names the mutant to run, if any, the file
a test writes a fail-point name to before sending ``SIGUSR1``, and (``arm``) a fail-point armed
from the start. The process kills itself with
SIGKILL the next time it passes that point (or stops itself, for a point armed as
``name:stop``). Production code guards each call site with one
global check (``if _faults.ON:``), so a disabled fail-point costs nothing more.

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
from pathlib import Path
from types import FrameType

__all__ = ["MUTANTS", "ON", "POINTS", "mutant", "point"]

MUTANTS = (
    "offset_before_commit", "claim_skipped", "claim_outside_tx", "claim_no_wait",
    "cache_before_commit", "lanes_ignore_key", "relay_cursor",
)
POINTS = (
    "after_claim", "before_commit", "after_commit", "after_cache_write", "relay_after_publish",
)

_raw = os.environ.get("CONSUMERKIT_TORTURE", "")
ON = bool(_raw)
_config: dict[str, str] = json.loads(_raw) if ON else {}
_mutant = _config.get("mutant", "")
if _mutant and _mutant not in MUTANTS:
    raise ValueError(f"CONSUMERKIT_TORTURE: unknown mutant {_mutant!r}")
_armed = _config.get("arm", "")


def mutant(name: str) -> bool:
    """Whether this process runs the broken variant ``name``."""
    return _mutant == name


def point(name: str) -> None:
    """Die at once (SIGKILL, no clean-up) if the point ``name`` is armed. Armed as
    ``name:stop``, freeze there instead (SIGSTOP, once), a zombie in the middle of its work
    until the test sends SIGCONT."""
    global _armed
    if _armed == name:
        os.kill(os.getpid(), signal.SIGKILL)
    elif _armed == f"{name}:stop":
        _armed = ""
        os.kill(os.getpid(), signal.SIGSTOP)


def _arm(signum: int, frame: FrameType | None) -> None:
    global _armed
    try:
        _armed = Path(_config["arm_file"]).read_text().strip()
    except (KeyError, OSError):
        _armed = _config.get("arm", "")


if ON and "arm_file" in _config:
    signal.signal(signal.SIGUSR1, _arm)
