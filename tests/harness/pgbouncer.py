"""A real PgBouncer in front of a PostgreSQL, for the tests and ``scripts/test-pooler.sh``.

:func:`start_pgbouncer` writes a configuration in a temporary directory (a free port on
127.0.0.1, clients trusted, the server reached as the given DSN says) and starts it;
``pool_mode = transaction`` by default, with ``max_prepared_statements = 0`` where the version
knows that setting (1.21 and later), so that it behaves as PgBouncer before 1.21 does: a
client's prepared statements reach whichever backend serves its transaction. Without a
``pgbouncer`` binary it raises :class:`MissingToolError`, saying what to install.

``python -m tests.harness.pgbouncer [DSN]`` starts one in front of ``DSN`` (else an embedded
PostgreSQL), prints the direct DSN and PgBouncer's on two lines, and runs until terminated
(SIGTERM or SIGINT), then stops both.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from consumerkit.shared.pooler import POOLERS, Pooler
from consumerkit.testing._common import free_port

from .kafka_jars import MissingToolError


def check_pooler(value: str) -> Pooler:
    """``value`` when it names a pooler mode (a test process's ``--pooler``); else
    :class:`ValueError` naming the modes."""
    if value not in POOLERS:
        raise ValueError(f"pooler must be one of {', '.join(POOLERS)}, not {value!r}")
    return value  # type: ignore[return-value]  # checked just above


START_TIMEOUT = 30.0


BINARY_ENV = "CONSUMERKIT_TEST_PGBOUNCER"
"""A PgBouncer binary to use instead of the one on PATH (a 1.21+ build, say, for
``max_prepared_statements``)."""


def _binary() -> str | None:
    if chosen := os.environ.get(BINARY_ENV):
        return chosen if os.access(chosen, os.X_OK) else None
    return shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer") if os.access(p, os.X_OK)),
        None)


def _version(binary: str) -> tuple[int, int]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10,
                         check=False).stdout
    found = re.search(r"PgBouncer (\d+)\.(\d+)", out)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


@dataclass
class PgBouncer:
    """A running PgBouncer: ``dsn`` reaches the tests' database through it."""

    dsn: str
    mode: str
    version: tuple[int, int]
    process: subprocess.Popen[bytes]
    workdir: Path

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.workdir / "pgbouncer.log").read_text(errors="replace")[-4000:]
        return ""

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _server(dsn: str) -> tuple[str, str, str, str | None, str]:
    """Host (or socket directory), port, user, password and database of ``dsn``."""
    parts = urlsplit(dsn)
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    host = query.get("host") or parts.hostname or "localhost"
    port = query.get("port") or str(parts.port or 5432)
    user = unquote(parts.username or query.get("user") or "postgres")
    password = unquote(parts.password) if parts.password else query.get("password")
    database = unquote(parts.path.lstrip("/")) or user
    return host, port, user, password, database


def start_pgbouncer(dsn: str, *, mode: str = "transaction", pool_size: int = 8,
                    prepared_statements: int = 0) -> PgBouncer:
    """``prepared_statements``: PgBouncer's ``max_prepared_statements`` (1.21 and later);
    0, the default, behaves as PgBouncer before 1.21."""
    binary = _binary()
    if binary is None:
        raise MissingToolError("pgbouncer is not installed (apt-get install pgbouncer)")
    version = _version(binary)
    host, port, user, password, database = _server(dsn)
    workdir = Path(tempfile.mkdtemp(prefix="consumerkit-pgbouncer-"))
    listen = free_port()
    server = f"host={host} port={port} user={user} dbname={database}"
    if password:
        server += f" password={password}"
    settings = {
        "listen_addr": "127.0.0.1", "listen_port": str(listen), "unix_socket_dir": "",
        "auth_type": "trust", "auth_file": str(workdir / "users.txt"),
        "pool_mode": mode, "default_pool_size": str(pool_size), "min_pool_size": "0",
        "max_client_conn": "500", "logfile": str(workdir / "pgbouncer.log"),
        "pidfile": str(workdir / "pgbouncer.pid"), "admin_users": user,
        # what asyncpg sends at start-up and PgBouncer does not track
        "ignore_startup_parameters": "extra_float_digits",
    }
    if version >= (1, 21):
        settings["max_prepared_statements"] = str(prepared_statements)
    elif prepared_statements:
        raise MissingToolError(
            f"PgBouncer {version[0]}.{version[1]} has no max_prepared_statements (1.21 and "
            f"later; {BINARY_ENV} names another binary)")
    lines = ["[databases]", f"* = {server}", "", "[pgbouncer]",
             *(f"{k} = {v}" for k, v in settings.items())]
    (workdir / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
    (workdir / "users.txt").write_text(f'"{user}" ""\n')
    command = [binary, str(workdir / "pgbouncer.ini")]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root: as the socket's owner, then
        # (the embedded server's socket directory admits its owner alone)
        owner = Path(host).owner() if host.startswith("/") else "nobody"
        command[1:1] = ["-u", owner]
        for path in (workdir, *workdir.iterdir()):
            shutil.chown(path, owner)
    # a file, not a pipe: PgBouncer also logs to stderr, and a pipe nobody reads fills and
    # blocks it mid-test
    with open(workdir / "stderr.log", "wb") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    bouncer = PgBouncer(f"postgresql://{user}@127.0.0.1:{listen}/{database}", mode, version,
                        process, workdir)
    deadline = time.monotonic() + START_TIMEOUT
    while not _accepts(listen):
        if process.poll() is not None or time.monotonic() > deadline:
            err = (workdir / "stderr.log").read_text(errors="replace")
            log = bouncer.log()
            bouncer.stop()
            raise RuntimeError(f"pgbouncer did not start: {err}\n{log}")
        time.sleep(0.05)  # polling a port that is not open yet: no event to wait on
    return bouncer


def _accepts(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def main(argv: list[str]) -> int:
    import signal
    import sys
    import threading

    from consumerkit.testing.services import start_postgres

    with contextlib.ExitStack() as stack:
        dsn = argv[0] if argv else stack.enter_context(start_postgres()).dsn
        try:  # 20 backends: a common production pool, room for a test's consumers and relays
            bouncer = start_pgbouncer(dsn, pool_size=20)
        except MissingToolError as exc:
            print(exc, file=sys.stderr)
            return 2
        stack.callback(bouncer.stop)
        print(dsn, bouncer.dsn, sep="\n", flush=True)
        done = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: done.set())
        signal.signal(signal.SIGINT, lambda *_: done.set())
        while not done.wait(1.0):
            if bouncer.process.poll() is not None:
                print(f"pgbouncer exited: {bouncer.log()}", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
