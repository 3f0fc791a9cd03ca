"""``consumerkit run`` and ``consumerkit relay`` with ``--metrics-port``, as an operator runs
them: ``/readyz`` turns 200 once ready, ``/metrics`` counts what was sent, the lag and the
outbox backlog fall to 0, SIGTERM exits with 0, and every JSON log line carries its fields."""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import orjson

from consumerkit.outbox import Outbox, OutboxTable
from consumerkit.outbox.table import SLOTS
from consumerkit.testing.services import MakeTopic, free_port
from consumerkit.transport.kafka import KafkaProducer

from ..brokers import IDEMPOTENCE_FLAG, PRODUCER_OPTIONS
from ..observability.scrape import get, samples, value
from ..outbox.conftest import read_all
from .conftest import PASSWORD, Done, cli, start, with_password
from .test_run import publish

DISTINCT = 30
DUPLICATES = 12
PENDING = 25
MESSAGES = "consumerkit_messages_total"


class Command:
    """A running ``consumerkit`` command whose stdout and stderr are read as they come, so
    neither pipe fills up however much it logs."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        assert proc.stderr is not None
        self.proc = proc
        self.out = bytearray()
        self.err = bytearray()
        self._readers = [asyncio.create_task(self._read(proc.stdout, self.out)),
                         asyncio.create_task(self._read(proc.stderr, self.err))]

    @staticmethod
    async def _read(stream: asyncio.StreamReader, into: bytearray) -> None:
        while chunk := await stream.read(65536):
            into.extend(chunk)

    async def until(self, check: Callable[[], Awaitable[bool]], what: str,
                    timeout: float = 60) -> None:
        """Poll ``check`` until it holds; fail after ``timeout`` or if the command exits."""
        try:
            async with asyncio.timeout(timeout):
                while not await check():
                    assert self.proc.returncode is None, f"the command exited waiting for {what}"
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None

    async def finish(self, sig: signal.Signals | None = signal.SIGTERM,
                     timeout: float = 60) -> Done:
        if sig is not None and self.proc.returncode is None:
            self.proc.send_signal(sig)
        async with asyncio.timeout(timeout):
            code = await self.proc.wait()
            await asyncio.gather(*self._readers)
        return Done(code, self.out.decode(), self.err.decode())


@asynccontextmanager
async def running(*argv: str, cwd: Path, env: dict[str, str]) -> AsyncIterator[Command]:
    """The command, killed if the test fails while it runs (its stderr in the failure)."""
    command = Command(await start(*argv, cwd=cwd, env=env))
    try:
        yield command
    except BaseException as exc:
        done = await command.finish(signal.SIGKILL)
        exc.add_note(f"the command's stderr:\n{done.err}")
        raise


async def status(port: int, path: str) -> int:
    return (await get(port, path))[0]


async def send_poison(bootstrap: str, topic: str) -> str:
    """A charge the handler refuses with ``DeadLetter``; returns its event id."""
    event_id = f"{topic}-poison"
    producer = KafkaProducer(bootstrap, dict(PRODUCER_OPTIONS))
    await producer.start()
    try:
        await producer.send(topic, key=b"poison",
                            value=orjson.dumps({"order_id": "poison", "amount": -1}),
                            headers=[("id", event_id.encode()), ("event_type", b"charge")])
    finally:
        await producer.stop()
    return event_id


async def test_run_serves_readiness_outcomes_and_lag_on_the_metrics_port(
    app_dir: Path, postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic,
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    topic = await make_topic(2)
    await pg_pool.execute(f'CREATE SCHEMA "{pg_schema}"')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".charges (order_id text NOT NULL, '
                          'amount int NOT NULL)')
    await publish(kafka_bootstrap, topic, DISTINCT)
    await publish(kafka_bootstrap, topic, DUPLICATES)  # the first ones again, same event ids
    poison = await send_poison(kafka_bootstrap, topic)
    group = f"cli-{uuid.uuid4().hex[:8]}"
    gate = app_dir / "gate"  # the consumer's start-up waits for this file
    port = free_port()
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": topic, "CLI_TEST_GROUP": group,
           "CLI_TEST_GATE": str(gate), "CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn)}

    async def counted() -> bool:
        found = await samples(port)
        return [value(found, MESSAGES, consumer=group, topic=topic, outcome=outcome)
                for outcome in ("applied", "duplicate", "dead_lettered")] == [
                    DISTINCT, DUPLICATES, 1]

    async def caught_up() -> bool:
        lags = {dict(labels)["partition"]: v for (name, labels), v in (await samples(port)).items()
                if name == "consumerkit_consumer_lag" and dict(labels)["topic"] == topic}
        return lags == {"0": 0, "1": 0}

    async with running("run", "app_consumer:build", "--kafka", kafka_bootstrap,
                       "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                       "--log-format", "json", cwd=app_dir, env=env) as command:
        await command.until(lambda: _is(port, "/healthz", 200), "the metrics port to answer",
                            timeout=30)
        # start-up is held: alive, but not ready
        assert await get(port, "/readyz") == (503, "starting\n")
        assert value(await samples(port), "consumerkit_ready", role="consumer", name=group) == 0
        gate.touch()
        await command.until(lambda: _is(port, "/readyz", 200), "/readyz to turn 200")
        assert value(await samples(port), "consumerkit_ready", role="consumer", name=group) == 1
        await command.until(counted, "applied, duplicate and dead_lettered counts")
        await command.until(caught_up, "the lag of both partitions to fall to 0")
        assert await status(port, "/healthz") == 200
        assert await status(port, "/readyz") == 200
        assert await pg_pool.fetchval(f'SELECT count(*) FROM "{pg_schema}".charges') == DISTINCT
        assert await pg_pool.fetchval(
            f'SELECT event_id FROM "{pg_schema}".dead_letters WHERE consumer = $1',
            group) == poison
        done = await command.finish()

    assert done.code == 0, done.err
    assert "Traceback" not in done.err
    assert PASSWORD not in done.output
    entries = [json.loads(line) for line in done.err.splitlines()]
    assert entries
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
    [dead] = [e for e in entries if e["message"].startswith("dead-lettered")]
    assert dead["level"] == "WARNING"
    assert dead["event_id"] == poison
    assert dead["topic"] == topic
    assert dead["consumer"] == group
    assert isinstance(dead["partition"], int)
    assert isinstance(dead["offset"], int)
    assert dead["handler"].endswith("charge")
    assert any("SIGTERM received" in e["message"] for e in entries)
    assert (await get(port, "/healthz"))[0] == 0  # the endpoint closed with the consumer


async def test_relay_serves_pending_and_published_on_the_metrics_port(
    tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic,
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    dsn = with_password(postgres_dsn)
    env = {"CONSUMERKIT_POSTGRES_DSN": dsn, "CONSUMERKIT_POSTGRES_SCHEMA": pg_schema}
    migrated = await cli("migrate", cwd=tmp_path, env=env)
    assert migrated.code == 0, migrated.err
    outbox = Outbox(pg_schema)
    async with pg_pool.acquire() as conn, conn.transaction():
        for n in range(PENDING):
            await outbox.add(conn, event_type="order.placed", aggregate_type="order",
                             aggregate_id=f"order-{n % 7}", payload={"n": n})
    topic = await make_topic(2)
    port = free_port()
    label = f"{pg_schema}.outbox"

    async def backlog() -> tuple[float | None, float | None]:
        found = await samples(port)
        return (value(found, "consumerkit_outbox_pending", outbox=label),
                value(found, "consumerkit_outbox_published_total", outbox=label))

    async def counted() -> bool:  # the gauges start at 0: wait for the first count
        return await status(port, "/metrics") == 200 and (await backlog()) != (0, 0)

    async def drained() -> bool:
        return await backlog() == (0, PENDING)

    # another session holds every slot's lock, as a relay would: this one counts its backlog
    # but may publish nothing until they are released
    blocker = await asyncpg.connect(postgres_dsn)
    try:
        await blocker.execute("SELECT pg_advisory_lock($1, s) FROM generate_series(0, $2) s",
                              OutboxTable(pg_schema, "outbox").lock_class, SLOTS - 1)
        async with running("relay", "--kafka", kafka_bootstrap, "--route", topic,
                           *IDEMPOTENCE_FLAG,
                           "--metrics-port", str(port), "--metrics-host", "127.0.0.1",
                           "--log-level", "info", cwd=tmp_path, env=env) as command:
            await command.until(counted, "the relay's first count of its backlog")
            assert await backlog() == (PENDING, 0)
            assert await status(port, "/readyz") == 200  # ready, though it owns no slot yet
            await blocker.close()
            await command.until(drained, "every row published, then none pending")
            assert await status(port, "/readyz") == 200
            assert await status(port, "/healthz") == 200
            records = await read_all(kafka_bootstrap, [topic],
                                     lambda found: len(found) >= PENDING)
            assert sorted(orjson.loads(r.value)["n"] for r in records if r.value) == list(
                range(PENDING))
            done = await command.finish()
    finally:
        await blocker.close()

    assert done.code == 0, done.err
    assert "Traceback" not in done.err
    assert f"stopped after publishing {PENDING} events" in done.err
    assert PASSWORD not in done.output
    assert PASSWORD not in migrated.output


async def _is(port: int, path: str, wanted: int) -> bool:
    return await status(port, path) == wanted
