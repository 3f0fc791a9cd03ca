"""The fault that makes concurrent copies of an event id: a consumer frozen right after a
claim, inside its transaction, past the session timeout. Its partitions move on, the new
owner claims the same ids while the zombie's transaction still holds them, then the zombie
wakes and commits. Only the claim's wait keeps both from applying the event (the mutant
``claim_no_wait`` drops it)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .faults import Rig

FREEZE = 9.0  # seconds: three session timeouts, for the new owner to reach the same records
STOP_WAIT = 8.0  # how long the armed point may take to be reached


def stopped_within(pid: int, timeout: float) -> bool:
    """Whether ``pid`` is stopped (state ``T`` in ``/proc``) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "T":
                    return True
        except OSError:
            return False  # gone
        time.sleep(0.02)
    return False


async def zombie_after_claim(rig: Rig) -> bool:
    from .faults import ARM_AFTER  # (faults imports this module)

    procs = rig.consumers()
    settled = [p for p in procs if time.monotonic() - p.started_at > ARM_AFTER]
    proc = rig.pick(settled or procs)
    proc.arm("after_claim:stop")
    if not await asyncio.to_thread(stopped_within, proc.pid, STOP_WAIT):
        proc.arm("")  # not reached in time: disarmed, not counted
        return False
    try:
        await asyncio.sleep(FREEZE)  # the length of the freeze is the fault itself
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    return True
