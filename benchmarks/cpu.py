"""Where a run's CPU went: this process (the peer), the database server, the broker, and the
whole machine.

On a machine of two cores a peer that saves its own CPU but makes the database work harder is
not faster, and the peer's process time alone would not show it. The server's share is the
CPU of the server's postmaster and its children, with what the postmaster reaped from those
that exited (a backend's time is counted once it ends too): server-wide, so other databases
of the same server are counted as well. Given no postmaster, every process named
``postgres`` on this machine counts; but another server's processes can then end between two
readings with their time reaped by no one counted (a server stopped, a killed primary's
orphaned backends), and the share would shrink. The broker's share is that of a process
named for Tansu. A server on another machine shows as "not measured". Linux only
(``/proc``); elsewhere nothing but the process's own time is measured.

A reading must not see a backend both alive and reaped, or neither: it lists the servers'
processes, reads them, and lists them again, and starts over when the list changed meanwhile.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

PROC = Path("/proc")
_ATTEMPTS = 20  # readings started over before one is taken as it is (a server forking fast)


def postmaster(backend: int) -> int | None:
    """The postmaster of the backend of pid ``backend`` when it runs on this machine."""
    found = _process(str(backend))
    return int(found[1]) if found is not None and found[0].startswith("postgres") else None


def reading(server: int | None = None) -> dict[str, float]:
    """CPU seconds so far: ``process`` always; ``machine`` where ``/proc`` tells, and
    ``database`` and ``broker`` when such processes run here (``database``: the postmaster
    ``server`` and its children, when given)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    seconds = {"process": usage.ru_utime + usage.ru_stime}
    if not (PROC / "stat").exists():
        return seconds
    tick = os.sysconf("SC_CLK_TCK")
    for _ in range(_ATTEMPTS):
        before = _servers(server)
        spent = {pid: _ticks(pid) for pid in before}
        if _servers(server) == before and None not in spent.values():
            break
    for pid, kind in before.items():
        seconds[kind] = seconds.get(kind, 0.0) + (spent[pid] or 0) / tick
    fields = (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
    # idle, waiting for I/O, and stolen by the hypervisor for other machines: not our work
    seconds["machine"] = (sum(ticks) - ticks[3] - ticks[4] - ticks[7]) / tick
    return seconds


def per_thousand(before: dict[str, float], after: dict[str, float],
                 messages: int) -> dict[str, float | None]:
    """CPU seconds per 1,000 messages between two readings, by where it went; ``None``
    where a reading has no figure (no such process here, or no ``/proc``)."""
    def share(name: str) -> float | None:
        if name not in before or name not in after or messages <= 0:
            return None
        return (after[name] - before[name]) / messages * 1000

    return {"cpu_s_per_1000": share("process"), "db_cpu_s_per_1000": share("database"),
            "broker_cpu_s_per_1000": share("broker"),
            "machine_cpu_s_per_1000": share("machine")}


def _servers(server: int | None) -> dict[str, str]:
    """The servers' processes now: pid -> "database" or "broker"."""
    found: dict[str, str] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or (process := _process(entry.name)) is None:
            continue
        name, parent = process
        if name.startswith("postgres") and (
                server is None or server in (int(entry.name), int(parent))):
            found[entry.name] = "database"
        elif name.startswith("tansu"):
            found[entry.name] = "broker"
    return found


def _process(pid: str) -> tuple[str, str] | None:
    """A process's name and its parent's pid; None if it is gone."""
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:  # gone meanwhile
        return None
    # the name may hold spaces and parentheses: it ends at the last ")"
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()[1]


def _ticks(pid: str) -> int | None:
    """A process's CPU with its reaped children's, in clock ticks; None if it is gone."""
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    # utime, stime, cutime, cstime: fields 14 to 17, counted after the ")" of the name
    return sum(int(f) for f in stat[stat.rindex(")") + 2:].split()[11:15])
