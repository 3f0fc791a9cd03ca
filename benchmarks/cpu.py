"""Where a run's CPU went: this process (the peer), the database server, the broker, and the
whole machine.

On a machine of two cores a peer that saves its own CPU but makes the database work harder is
not faster, and the peer's process time alone would not show it. The server's share is the
CPU of every process named ``postgres`` on this machine, with what its postmaster reaped from
backends that exited during the run (their time is counted once they end); the broker's,
that of a process whose command line names Tansu. Servers on other machines show no time;
other work on this machine shows in ``machine`` alone. Linux only (``/proc``); elsewhere
nothing but the process's own time is measured.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

PROC = Path("/proc")


def reading() -> dict[str, float]:
    """CPU seconds so far: ``process`` always; ``database``, ``broker`` and ``machine``
    where ``/proc`` tells."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    seconds = {"process": usage.ru_utime + usage.ru_stime}
    if not (PROC / "stat").exists():
        return seconds
    tick = os.sysconf("SC_CLK_TCK")
    seconds["database"] = seconds["broker"] = 0.0
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (found := _server(entry)) is not None:
            kind, spent = found
            seconds[kind] += spent / tick
    fields = (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
    seconds["machine"] = (sum(ticks) - ticks[3] - ticks[4]) / tick
    return seconds


def per_thousand(before: dict[str, float], after: dict[str, float],
                 messages: int) -> dict[str, float | None]:
    """CPU seconds per 1,000 messages between two readings, by where it went."""
    def share(name: str) -> float | None:
        if name not in before or name not in after or messages <= 0:
            return None
        return (after[name] - before[name]) / messages * 1000

    return {"cpu_s_per_1000": share("process"), "db_cpu_s_per_1000": share("database"),
            "broker_cpu_s_per_1000": share("broker"),
            "machine_cpu_s_per_1000": share("machine")}


def _server(entry: Path) -> tuple[str, int] | None:
    """("database" or "broker", CPU ticks with reaped children) for a server's process."""
    try:
        stat = (entry / "stat").read_text()
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        if name.startswith("postgres"):
            kind = "database"
        elif "tansu" in name or b"tansu" in (entry / "cmdline").read_bytes():
            kind = "broker"
        else:
            return None
    except (OSError, ValueError):  # gone meanwhile, or not ours to read
        return None
    # utime, stime, cutime, cstime: fields 14 to 17, counted after the ")" of the name
    fields = stat[stat.rindex(")") + 2:].split()
    return kind, sum(int(f) for f in fields[11:15])
