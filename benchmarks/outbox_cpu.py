"""Where a benchmark run spends CPU: the seconds each group of processes used, read from
``/proc`` (Linux; elsewhere nothing is reported)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far, or ``None`` if it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICK


def broker_pids(port: int) -> list[int]:
    """Processes whose command line names a broker listening on ``port``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(f":{port}".encode()) for a in argv) and b"broker" in argv:
            found.append(int(entry.name))
    return found


class CpuMeter:
    """CPU seconds per group (``{"relays": [pid, ...], ...}``) between construction and
    :meth:`read`."""

    def __init__(self, groups: Mapping[str, Iterable[int]]) -> None:
        self._groups = {name: list(pids) for name, pids in groups.items()}
        self._start = {pid: cpu_seconds(pid) for pids in self._groups.values() for pid in pids}

    def read(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for name, pids in self._groups.items():
            total = 0.0
            for pid in pids:
                before, now = self._start[pid], cpu_seconds(pid)
                if before is not None and now is not None:
                    total += now - before
            if pids:
                used[name] = total
        return used
