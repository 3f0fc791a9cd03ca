"""The torture's PgBouncer (``--pooler transaction``): one in transaction mode in front of the
run's PostgreSQL, which every consumer, relay and producer reaches through it with
``postgres_pooler="transaction"`` (the harness's own reads, set-up and faults go direct).

The faults that act on PostgreSQL still act on the real server behind it: a restart is one
PgBouncer sees as its server connections dying; after a failover it is pointed at the new
primary (its configuration rewritten and reloaded), as whatever follows the primary in a
real deployment would do. Two faults act on PgBouncer itself: a pause (SIGSTOP for 4 s,
every client's transaction frozen mid-way) and a restart (SIGKILL, then a new one on the same
port: every client connection cut, transactions in flight lost).

Debian's PgBouncer (1.18 here) knows no ``max_prepared_statements``; a newer one is told 0,
so that it behaves the same. PgBouncer refuses to run as root: as root it runs as the owner
of the server's socket directory, or as ``nobody`` over TCP.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from consumerkit.testing._common import free_port

from ..harness.pgbouncer import _accepts, _version
from ..harness.pgbouncer import _binary as find_binary
from .cluster import Database, OwnPostgres, ReplicatedCluster, pause_process

if TYPE_CHECKING:
    from .faults import Fault, Rig

START_TIMEOUT = 30.0
POOL_SIZE = 20  # server connections per database and user: a common production size
PAUSE = 4.0  # seconds the pause fault freezes PgBouncer


def _binary() -> str:
    found = find_binary()
    if found is None:
        raise RuntimeError("--pooler needs pgbouncer (apt-get install pgbouncer)")
    return found


def _target(postgres: Database) -> tuple[str, int]:
    """Where the primary of ``postgres`` listens now: (host or socket directory, port)."""
    if isinstance(postgres, ReplicatedCluster):
        return "127.0.0.1", postgres.pair.primary_port
    assert isinstance(postgres, OwnPostgres)
    return postgres.socket_dir, int(postgres.dsn.rsplit("port=", 1)[1])


class Bouncer:
    """A PgBouncer in transaction mode in front of ``postgres``; ``dsn`` reaches it."""

    def __init__(self, postgres: Database) -> None:
        self.binary = _binary()
        self.version = _version(self.binary)
        self.host, self.port = _target(postgres)
        self.workdir = Path(tempfile.mkdtemp(prefix="ck-torture-pgbouncer-"))
        self.listen = free_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.listen}/postgres"
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._write_config()
        self.start()
        if isinstance(postgres, ReplicatedCluster):
            postgres.on_promote.append(self.follow)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def _write_config(self) -> None:
        settings = {
            "listen_addr": "127.0.0.1", "listen_port": str(self.listen),
            "unix_socket_dir": "", "auth_type": "trust",
            "auth_file": str(self.workdir / "users.txt"), "pool_mode": "transaction",
            "default_pool_size": str(POOL_SIZE), "min_pool_size": "0",
            "max_client_conn": "1000", "logfile": str(self.workdir / "pgbouncer.log"),
            "pidfile": str(self.workdir / "pgbouncer.pid"), "admin_users": "postgres",
            "ignore_startup_parameters": "extra_float_digits",
            # the default 15 s after a failed login would outlast a restart of the server
            "server_login_retry": "1",
        }
        if self.version >= (1, 21):
            settings["max_prepared_statements"] = "0"  # as PgBouncer before 1.21
        server = f"host={self.host} port={self.port} user=postgres dbname=postgres"
        lines = ["[databases]", f"* = {server}", "", "[pgbouncer]",
                 *(f"{k} = {v}" for k, v in settings.items())]
        (self.workdir / "pgbouncer.ini").write_text("\n".join(lines) + "\n")
        (self.workdir / "users.txt").write_text('"postgres" ""\n')

    def start(self) -> None:
        command = [self.binary, str(self.workdir / "pgbouncer.ini")]
        if os.geteuid() == 0:  # as the socket's owner (its directory admits its owner alone)
            owner = Path(self.host).owner() if self.host.startswith("/") else "nobody"
            command[1:1] = ["-u", owner]
            for path in (self.workdir, *self.workdir.iterdir()):
                shutil.chown(path, owner)
        # its log goes to stderr too: a pipe nobody reads would fill, and block PgBouncer
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while not _accepts(self.listen):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"pgbouncer did not start: {self.log()}")
            time.sleep(0.05)  # polling a port that is not open yet: no event to wait on

    def log(self) -> str:
        try:
            return (self.workdir / "pgbouncer.log").read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def follow(self, port: int) -> None:
        """Point PgBouncer at the new primary: rewritten and reloaded, it closes its server
        connections to the old one as they are released."""
        self.port = port
        self._write_config()
        if self.process is not None and self.process.poll() is None:
            os.kill(self.pid, signal.SIGHUP)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> None:
        """SIGKILL and start again on the same port."""
        self.kill()
        self.start()
        self.restarts += 1

    def stop(self, keep: bool = False) -> None:
        self.kill()
        if not keep:
            shutil.rmtree(self.workdir, ignore_errors=True)


async def pooler_pause(rig: Rig) -> bool:
    """PgBouncer frozen for 4 s, every client's transaction with it, then resumed."""
    if rig.bouncer is None:
        return False
    await asyncio.to_thread(pause_process, rig.bouncer.pid, PAUSE)
    return True


async def pooler_restart(rig: Rig) -> bool:
    """PgBouncer killed (its clients' connections cut mid-transaction) and started again."""
    if rig.bouncer is None:
        return False
    await asyncio.to_thread(rig.bouncer.restart)
    return True


POOLER_KINDS: dict[str, Fault] = {"pooler_pause": pooler_pause,
                                  "pooler_restart": pooler_restart}
