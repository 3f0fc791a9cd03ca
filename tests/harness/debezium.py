"""Debezium for tests: a standalone Kafka Connect worker running the outbox connector.

:func:`start_debezium` runs ``org.apache.kafka.connect.cli.ConnectStandalone`` from Maven
Central's jars (:mod:`tests.harness.connect_jars`) with the connector settings of
:func:`consumerkit.outbox.debezium.event_router_config` (the ones a team deploys) plus the
connection to a PostgreSQL with ``wal_level=logical`` (:func:`start_logical_postgres`), and
waits, bounded, until the Connect REST API reports the connector and its task RUNNING and the
replication slot is active. The worker's source offsets live in a file that ``kill`` and
``start`` keep, so a restarted worker resumes from its last flushed position, as a deployed
one does.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import asyncpg

from consumerkit.outbox.debezium import event_router_config
from consumerkit.outbox.table import OutboxTable
from consumerkit.testing._common import ServiceStartError, free_port
from consumerkit.testing._process import _Service

from .connect_jars import DEBEZIUM_KAFKA_VERSION, DEBEZIUM_VERSION, connect_lib
from .kafka_config import JVM_OPTIONS, LOG4J2, render_properties
from .kafka_jars import MissingToolError, require_tools
from .kafka_lookup import in_thread
from .pg_logical import LogicalPostgres

__all__ = ["DebeziumWorker", "MissingToolError", "start_debezium"]

READY_TIMEOUT = 240.0  # a JVM scanning ~70 jars for plugins, on two busy cores
_POLL = 0.5
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_LOGGING = LOG4J2 + "logger.debezium.name = io.debezium\nlogger.debezium.level = INFO\n"


class DebeziumWorker(_Service):
    """A running Connect worker with one Debezium outbox connector; its ``slot`` is the
    replication slot on the PostgreSQL it reads."""

    def __init__(self, argv: list[str], home: Path, name: str, rest_port: int, slot: str,
                 dsn: str) -> None:
        self.home = home
        self.name = name
        self.rest_port = rest_port
        self.url = f"http://127.0.0.1:{rest_port}"
        self.slot = slot
        self.dsn = dsn
        self.log_path = home / "connect.log"
        self._argv = argv
        self._process: subprocess.Popen[bytes] | None = None
        atexit.register(self.stop)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start the worker (again, with its offsets file) and wait until it streams."""
        if not self.running():
            with self.log_path.open("ab") as log:
                self._process = subprocess.Popen(
                    self._argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    cwd=self.home, start_new_session=True)
        self.wait_running(timeout)

    def status(self) -> dict[str, Any] | None:
        """The connector's status from the REST API, ``None`` while it does not answer."""
        try:
            with urllib.request.urlopen(
                    f"{self.url}/connectors/{self.name}/status", timeout=5) as answer:
                found: dict[str, Any] = json.loads(answer.read())
                return found
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def wait_running(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until the connector and its task are RUNNING and the slot is active; raise
        :class:`ServiceStartError` with the worker's log if it fails, dies or is late."""
        deadline = time.monotonic() + timeout
        state = "no answer"
        while time.monotonic() < deadline:
            if not self.running():
                raise self._failure("exited")
            status = self.status()
            if status is not None:
                tasks = status.get("tasks") or []
                state = f"connector {status.get('connector', {}).get('state')}, tasks " + (
                    ", ".join(str(t.get("state")) for t in tasks) or "none")
                failed = [t for t in tasks if t.get("state") == "FAILED"]
                if failed:
                    raise self._failure(f"task FAILED: {str(failed[0].get('trace'))[:1500]}")
                if (status.get("connector", {}).get("state") == "RUNNING" and tasks
                        and all(t.get("state") == "RUNNING" for t in tasks)
                        and self.slot_active()):
                    return
            time.sleep(_POLL)
        raise self._failure(f"was not streaming within {timeout:g}s ({state})")

    def slot_active(self) -> bool:
        """Whether the replication slot exists and a reader holds it."""
        async def probe() -> bool:
            conn = await asyncpg.connect(self.dsn, timeout=5)
            try:
                return bool(await conn.fetchval(
                    "SELECT active FROM pg_replication_slots WHERE slot_name = $1", self.slot))
            finally:
                await conn.close()
        try:
            return in_thread(probe, 10.0)
        except Exception:  # PostgreSQL restarting; the caller's deadline bounds this
            return False

    def _failure(self, reason: str) -> ServiceStartError:
        return ServiceStartError(f"Kafka Connect (pid {self.pid}) {reason}; its log "
                                 f"({self.log_path}) ends:\n{self.output()[-4000:]}")

    def kill(self) -> None:
        """SIGKILL: offsets not yet flushed are lost, so Debezium re-sends from the last
        flushed position when started again."""
        if self.running():
            assert self._process is not None
            os.kill(self._process.pid, signal.SIGKILL)
            self._process.wait(60)

    def terminate(self, timeout: float = 60.0) -> None:
        """SIGTERM: a graceful stop, which flushes the source offsets (SIGKILL after
        ``timeout``); ``start`` resumes after the last event sent."""
        if self.running():
            assert self._process is not None
            self._process.terminate()
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def stop(self, drop_slot: bool = True) -> None:
        """Stop the worker, drop its replication slot (else it keeps WAL for a reader that
        never comes back) unless ``drop_slot`` is false, and delete its directory."""
        atexit.unregister(self.stop)
        self.terminate(30)
        if drop_slot:
            self._drop_slot()
        shutil.rmtree(self.home, ignore_errors=True)

    def _drop_slot(self) -> None:
        async def drop() -> None:
            conn = await asyncpg.connect(self.dsn, timeout=5)
            try:
                for _ in range(20):  # the walsender may take a moment to let go
                    if not await conn.fetchval(
                            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 "
                            "AND active", self.slot):
                        break
                    await asyncio.sleep(0.5)
                await conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM "
                                   "pg_replication_slots WHERE slot_name = $1", self.slot)
            finally:
                await conn.close()
        with contextlib.suppress(Exception):  # a server already gone keeps no WAL for anyone
            in_thread(drop, 30.0)


def worker_properties(bootstrap: str, home: Path, rest_port: int,
                      flush_interval_ms: int) -> dict[str, str]:
    """A standalone worker's settings: offsets in a file under ``home``, REST on loopback."""
    return {
        "bootstrap.servers": bootstrap,
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "offset.storage.file.filename": str(home / "offsets.dat"),
        "offset.flush.interval.ms": str(flush_interval_ms),
        "listeners": f"http://127.0.0.1:{rest_port}",
        "plugin.discovery": "only_scan",
    }


def connector_properties(name: str, postgres: LogicalPostgres, table: OutboxTable,
                         slot: str) -> dict[str, str]:
    """The deployed connector settings for ``table`` plus this PostgreSQL's connection, with
    the replication slot ``slot``; the publication is the table's, which must exist
    (``consumerkit.migrate`` of an outbox with a retention, else ``prepare_cdc`` or
    ``ensure_publication``)."""
    return {
        "name": name,
        **event_router_config(table),
        "database.hostname": postgres.host,
        "database.port": str(postgres.port),
        "database.user": postgres.user,
        "database.password": "",  # trust authentication on loopback
        "database.dbname": postgres.database,
        "topic.prefix": name,
        "slot.name": slot,
        "tasks.max": "1",
    }


def start_debezium(
    bootstrap: str, postgres: LogicalPostgres, *, table: OutboxTable | None = None,
    slot: str = "consumerkit_outbox", name: str = "outbox",
    kafka_version: str = DEBEZIUM_KAFKA_VERSION, debezium_version: str = DEBEZIUM_VERSION,
    flush_interval_ms: int = 1000, timeout: float = READY_TIMEOUT,
    overrides: Mapping[str, str] | None = None,
) -> DebeziumWorker:
    """Start a Connect worker whose Debezium connector streams ``table``'s inserts from
    ``postgres`` to the Kafka at ``bootstrap``, and wait until it streams.

    ``overrides`` are connector settings beyond the deployed ones (``poll.interval.ms``, say).
    Without Java 17+ (or Maven, for the first fetch) it raises :class:`MissingToolError`,
    whose one-line message says what to install.
    """
    if not _NAME.match(slot):
        raise ValueError(f"slot name {slot!r}: use 1-63 lowercase letters, digits and '_'")
    if not _NAME.match(name):
        raise ValueError(f"connector name {name!r}: use lowercase letters, digits and '_'")
    java, _ = require_tools(maven=False)
    lib = connect_lib(kafka_version, debezium_version)
    home = Path(tempfile.mkdtemp(prefix="consumerkit-connect-"))
    rest_port = free_port()
    (home / "worker.properties").write_text(render_properties(
        worker_properties(bootstrap, home, rest_port, flush_interval_ms)))
    (home / "connector.properties").write_text(render_properties({**connector_properties(
        name, postgres, table or OutboxTable(), slot), **(overrides or {})}))
    (home / "log4j2.properties").write_text(_LOGGING)
    argv = [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}",
            "-cp", f"{lib}/*", "org.apache.kafka.connect.cli.ConnectStandalone",
            str(home / "worker.properties"), str(home / "connector.properties")]
    worker = DebeziumWorker(argv, home, name, rest_port, slot, postgres.dsn)
    try:
        worker.start(timeout)
    except BaseException:
        worker.stop()
        raise
    return worker
