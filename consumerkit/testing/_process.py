"""The process primitives of the local services: bounded waits and server children.

Shared by :mod:`consumerkit.testing.services` (Tansu, PostgreSQL, Redis) and the repository's
own harnesses (``tests/harness``: Apache Kafka, Debezium, replicated PostgreSQL).
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from ._common import ServiceStartError

_POLL_INTERVAL = 0.02


def _wait_for(condition: Callable[[], bool], timeout: float, alive: Callable[[], bool]) -> bool:
    """Poll ``condition`` until it holds (True), ``alive`` fails or the deadline passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        if not alive():
            return False
        time.sleep(_POLL_INTERVAL)
    return condition()


def _tcp_accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class _Service:
    """A running service: ``stop()`` it, or use it as a context manager."""

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class _ServerProcess(_Service):
    """A server child process with its own temporary directory, holding its log file."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix=f"consumerkit-{name}-"))
        self.log_path = self.workdir / f"{name}.log"
        self._name = name
        with self.log_path.open("wb") as log:
            # A session of its own: Ctrl-C in a terminal reaches the program, which then stops
            # its clients before this server (stop() or, at the latest, exit).
            self._process = subprocess.Popen(  # noqa: S603 - argv is built here, no shell
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.workdir, env={**os.environ, "NO_COLOR": "1"}, start_new_session=True,
            )
        atexit.register(self.stop)

    @property
    def pid(self) -> int:
        return self._process.pid

    def running(self) -> bool:
        return self._process.poll() is None

    def output(self) -> str:
        """The server's output so far (stdout and stderr, interleaved)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _wait_ready(self, condition: Callable[[], bool], timeout: float) -> None:
        if _wait_for(condition, timeout, self.running):
            return
        exit_code = self._process.poll()
        output = self.output()
        self.stop()
        state = "is still running" if exit_code is None else f"exited with code {exit_code}"
        raise ServiceStartError(
            f"{self._name} (pid {self.pid}) was not ready within {timeout:g}s and {state}; "
            f"its output:\n{output[-4000:]}"
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the process, kill it if it is still there after ``timeout`` seconds."""
        atexit.unregister(self.stop)
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        return True
    return True
