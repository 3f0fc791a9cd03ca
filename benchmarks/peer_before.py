"""consumerkit's defaults as they were before batch handlers and ``ctx.defer``, in the same run.

Issue 12 asks that a handler awaiting ``ctx.tx.execute`` be no slower than the defaults of the
day it was written. That code is revision :data:`BEFORE` (the last commit before the issues of
that day were worked on). One process cannot import two consumerkits, so this peer runs that
revision's ``Consumer`` in a process of its own (:mod:`benchmarks.before_worker`), with its
own migrations and dedup table, on the footing of the peers in the runner's process: the same
event loop and the same collector settings. Its counts reach the runner over the worker's
standard output, and so does its CPU: what it spent from the end of its start-up to its exit,
which the runner adds to its own process's share.

The worker does one thing the in-process peers do not: the runner's progress sampling and
effect polling run in the runner's process, not beside the consumer. The difference favours
this peer, so a verdict "no slower" errs against the current code.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import asyncpg

from consumerkit.shared import aio

from .before_worker import DSN_VARIABLE
from .effects import DbEffect
from .peers import FAST_GROUP, Peer, PeerEnv
from .versus import ROOT
from .workload import EVENT_TYPE

WORKER = Path(__file__).resolve().parent / "before_worker.py"
BEFORE = "b0bee64014c3791d6d7f8c1dd388682af4d3f27a"
"""The revision whose defaults target 7 is measured against: main when the engine issue was
opened."""
STOP_TIMEOUT = 30.0  # the runner waits 60 s for a peer to end: the worker's errors come first
SHORT = BEFORE[:7]
"""The revision as reports name it."""
MIGRATE_TIMEOUT = 120.0
_trees: dict[str, tempfile.TemporaryDirectory[str]] = {}


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=False)


def tree(revision: str = BEFORE) -> Path:
    """A directory holding ``revision``'s ``consumerkit`` package (made once per process)."""
    if revision not in _trees:
        archive = _git("archive", "--format=tar", revision, "consumerkit")
        if archive.returncode:
            raise RuntimeError(f"git archive {revision}: {archive.stderr.decode().strip()}")
        made = tempfile.TemporaryDirectory(prefix=f"ck-{revision}-")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            if hasattr(tarfile, "data_filter"):  # Python 3.11.4 and later
                tar.extractall(made.name, filter="data")
            else:  # our own repository's archive
                tar.extractall(made.name)
        _trees[revision] = made
    return Path(_trees[revision].name)


class ConsumerkitBeforePeer(Peer):
    name = "consumerkit-before"
    description = (f"consumerkit's defaults at {SHORT} (before batch handlers and ctx.defer), "
                   "the same awaited upsert in a handler, in a process of its own")
    dedup_table = "processed_events"

    @classmethod
    def unavailable(cls, redis_url: str | None) -> str | None:
        try:
            found = _git("cat-file", "-e", f"{BEFORE}^{{commit}}")
        except OSError as exc:
            return f"no git to read revision {SHORT}: {exc}"
        if found.returncode:
            return f"revision {SHORT} is not in this checkout's history (a git clone is needed)"
        return None

    def __init__(self, env: PeerEnv) -> None:
        super().__init__(env)
        if not isinstance(env.effect, DbEffect):
            raise RuntimeError(f"{self.name} measures database effects only")
        self.effect = env.effect
        self._counts = (0, 0)
        self._startup = 0.0

    def handled(self) -> int:
        return self._counts[1]

    def received(self) -> int:
        return self._counts[0]

    def _command(self, command: str, *extra: str) -> list[str]:
        e = self.env
        # -P: neither the worker's directory nor the working directory on sys.path
        return [sys.executable, "-P", str(WORKER), command, "--schema", e.schema,
                "--group", e.group, *extra]

    async def _spawn(self, command: list[str]) -> asyncio.subprocess.Process:
        # PYTHONPATH at the old tree: its consumerkit comes before this one's (the editable
        # install's path comes after it)
        where = tree()
        return await asyncio.create_subprocess_exec(
            *command, cwd=where,  # the DSN in the environment: no password in a process list
            env={**os.environ, "PYTHONPATH": str(where), DSN_VARIABLE: self.env.dsn},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)

    async def prepare(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        process = await self._spawn(self._command("migrate"))
        try:
            out, err = await asyncio.wait_for(process.communicate(), MIGRATE_TIMEOUT)
        except TimeoutError as exc:
            process.kill()
            await process.wait()
            raise RuntimeError(
                f"{SHORT} migrate did not finish in {MIGRATE_TIMEOUT:g}s") from exc
        if process.returncode:
            raise RuntimeError(f"{SHORT} migrate failed: {err.decode().strip()[-500:]}")
        for line in out.splitlines():
            self._read(line)

    async def prefill(self, conn: asyncpg.Connection[asyncpg.Record], rows: int) -> None:
        raise RuntimeError(f"{self.name} runs in the main cell only (no pre-filled table)")

    def _footing(self) -> list[str]:
        """The event loop and collector settings of this process, for the worker."""
        flags = []
        if aio.describe().startswith("uvloop"):
            flags.append("--uvloop")
        if gc.get_freeze_count():
            flags += ["--young", str(gc.get_threshold()[0])]
        return flags

    def _read(self, line: bytes) -> None:
        """One line of the worker's (see :mod:`benchmarks.before_worker`)."""
        word, _, rest = line.decode().rstrip("\n").partition(" ")
        if word == "module":  # the consumerkit it imported must be the old tree's
            if not Path(rest).resolve().is_relative_to(tree().resolve()):
                raise RuntimeError(f"the {SHORT} worker imported consumerkit from {rest}")
        elif word == "startup":
            self._startup = float(rest)
        elif word == "cpu":
            self.cpu_elsewhere = max(0.0, float(rest) - self._startup)
        elif len(fields := line.split()) == 3:
            self._counts = (int(fields[0]), int(fields[1]))
            if float(fields[2]) and self.began is None:
                self.began = float(fields[2])
        else:
            raise RuntimeError(f"the {SHORT} worker printed {line[:200]!r}")

    async def run(self) -> None:
        e = self.env
        process = await self._spawn(self._command(
            "consume", "--bootstrap", e.bootstrap, "--topic", e.topic,
            "--event-type", EVENT_TYPE, "--sql", self.effect.sql,
            "--kafka-options", json.dumps(FAST_GROUP), *self._footing()))
        assert process.stdout is not None
        assert process.stderr is not None
        errors = asyncio.create_task(process.stderr.read())
        stopper = asyncio.create_task(self._stop_on_request(process))
        try:
            async for line in process.stdout:
                self._read(line)
            await process.wait()
        finally:
            stopper.cancel()
            if process.returncode is None:
                process.kill()
                await process.wait()
            err = (await errors).decode().strip()
        # a SIGTERM before the worker's handler was in place ends it this way: a stop all the same
        stopped = self.stop.is_set() and process.returncode == -signal.SIGTERM
        if process.returncode and not stopped:
            raise RuntimeError(f"{SHORT} consumer exited {process.returncode}: {err[-500:]}")

    async def _stop_on_request(self, process: asyncio.subprocess.Process) -> None:
        await self.stop.wait()
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
        except TimeoutError:
            process.kill()
