"""Running the ``consumerkit`` command as a subprocess, and DSNs holding a password."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

PASSWORD = "Sw0rdfish-hunter2"
HERE = Path(__file__).parent


def with_password(dsn: str, password: str = PASSWORD) -> str:
    """``dsn`` holding ``password`` (PostgreSQL here trusts local connections, so a DSN
    without one still connects; one that needs its own keeps it)."""
    parts = urlsplit(dsn)
    if parts.password:
        return dsn
    user, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{user or 'postgres'}:{password}@{host}"))


def password_of(dsn: str) -> str:
    password = urlsplit(dsn).password
    assert password
    return password


@dataclass
class Done:
    code: int
    out: str
    err: str

    @property
    def output(self) -> str:
        return self.out + self.err


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUMERKIT_")}
    return {**env, **(extra or {})}


async def start(*argv: str, cwd: Path, env: Mapping[str, str] | None = None,
                ) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumerkit", *argv, cwd=cwd, env=environment(env),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def finish(proc: asyncio.subprocess.Process, timeout: float = 60) -> Done:
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return Done(proc.returncode, out.decode(), err.decode())


async def cli(*argv: str, cwd: Path, env: Mapping[str, str] | None = None,
              timeout: float = 60) -> Done:
    return await finish(await start(*argv, cwd=cwd, env=env), timeout)


async def terminate(proc: asyncio.subprocess.Process, timeout: float = 60) -> Done:
    proc.send_signal(signal.SIGTERM)
    return await finish(proc, timeout)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """A directory holding the test consumer's module, as a team's project would."""
    shutil.copy(HERE / "app_consumer.py", tmp_path / "app_consumer.py")
    return tmp_path
