"""The harness's own OS processes (consumers, relays, the producer): started by name, each
with its own log and fail-point file, signalled and restarted by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def exit_reason(log: Path) -> str:
    """The error a process died of: the last line of its log that names an exception, as a
    traceback's last line does (``module.Error: message``), or ``"unknown"``."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            tail = f.read().decode(errors="replace").splitlines()
    except OSError:
        return "unknown"
    for line in reversed(tail):
        name, sep, _ = line.partition(": ")
        if sep and not line.startswith((" ", "20")) and name.rsplit(".", 1)[-1].endswith(
                ("Error", "Exception", "Interrupt", "Exit")):
            return line[:300]
    return "unknown"


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    arm_file: Path
    popen: subprocess.Popen[bytes] | None = None
    starts: int = 0
    started_at: float = 0.0
    unexpected_exits: list[str] = field(default_factory=list)  # "code: last error line"

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        self.arm_file.write_text("")
        with self.log.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.starts += 1
        self.started_at = time.monotonic()

    def signal(self, sig: signal.Signals) -> None:
        if self.running():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL (after SIGCONT, in case it was frozen) and reap."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGKILL)
        self.popen.wait(30)

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; the exit code (None if killed)."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGTERM)
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                return None
        return self.popen.returncode

    def arm(self, point: str) -> None:
        """Make the process kill itself the next time it passes ``point`` ("" disarms)."""
        self.arm_file.write_text(point)
        self.signal(signal.SIGUSR1)

    def died_within(self, timeout: float) -> bool:
        assert self.popen is not None
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True


class Procs:
    def __init__(self, workdir: Path, mutant: str) -> None:
        self.workdir = workdir
        self.mutant = mutant
        self.by_name: dict[str, Proc] = {}

    def add(self, name: str, module: str, *args: str) -> Proc:
        arm_file = self.workdir / f"{name}.arm"
        torture = {"arm_file": str(arm_file)}
        if self.mutant:
            torture["mutant"] = self.mutant
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TORTURE_PROCESS": name,
               "CONSUMERKIT_TORTURE": json.dumps(torture)}
        proc = Proc(name, [sys.executable, "-m", module, *args], env,
                    self.workdir / f"{name}.log", arm_file)
        self.by_name[name] = proc
        return proc

    def role(self, prefix: str) -> list[Proc]:
        return [p for n, p in sorted(self.by_name.items()) if n.startswith(prefix)]

    def revive(self, procs: list[Proc]) -> None:
        """Restart those of ``procs`` that died by themselves (not by the harness)."""
        for proc in procs:
            if proc.popen is not None and not proc.running():
                proc.unexpected_exits.append(
                    f"{proc.popen.returncode}: {exit_reason(proc.log)}")
                proc.start()

    def stop_all(self) -> None:
        deadline = time.monotonic() + 30
        for proc in self.by_name.values():
            proc.signal(signal.SIGCONT)
            proc.signal(signal.SIGTERM)
        for proc in self.by_name.values():
            if proc.popen is None:
                continue
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
