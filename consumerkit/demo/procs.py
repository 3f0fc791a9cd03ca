"""The demo's worker processes: started, SIGKILLed, restarted and stopped by pid.

Each worker runs in a session of its own, so Ctrl-C in a terminal reaches only the demo, which
then stops every worker it started (SIGTERM, then SIGKILL after a grace period). Output goes to
one log file per run, shown when something goes wrong.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE = 15.0  # seconds a worker gets to stop after SIGTERM


class Workers:
    def __init__(self, run: str, kafka: str, dsn: str, log_path: Path,
                 idempotence: bool = False) -> None:
        self.run = run
        self.options = ["--idempotence"] if idempotence else []  # the relays' producer
        self.env = {**os.environ, "CONSUMERKIT_KAFKA_BOOTSTRAP": kafka,
                    "CONSUMERKIT_POSTGRES_DSN": dsn}
        self.log_path = log_path
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.started: list[int] = []  # every pid ever started, for the report and the checks

    def start(self, role: str) -> int:
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(  # noqa: S603 - argv built here, no shell
                [sys.executable, "-m", "consumerkit.demo.worker", role, "--run", self.run,
                 *self.options],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                start_new_session=True)
        self.procs[role] = proc
        self.started.append(proc.pid)
        return proc.pid

    def kill(self, role: str) -> int:
        """SIGKILL the role's process and reap it; returns its pid."""
        proc = self.procs[role]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        return proc.pid

    def failed(self) -> str | None:
        """A worker that exited by itself, if any (they run until stopped)."""
        for role, proc in self.procs.items():
            if proc.poll() is not None:
                return f"the {role} worker (pid {proc.pid}) exited with code {proc.returncode}"
        return None

    def stop_all(self) -> None:
        """SIGTERM every worker still running, then SIGKILL those left after the grace."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
