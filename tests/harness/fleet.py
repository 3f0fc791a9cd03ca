"""A fleet of consumer processes draining a backlog of one topic, with the server's lock table
watched while they run: the acceptance test of the claim's lock-table entries
(``tests/integration/test_twelve_processes.py``) and the benchmark of how they scale with the
processes (``benchmarks/lock_scaling.py``).

Each process is the torture's consumer (``tests.torture.consumer_proc``) with a Consumer's
defaults for batching: 5,000 records in flight, batches of 500, concurrency 4. Its handler
writes the torture's ledger (one effect row per application, no unique constraint: a
duplicate would show). The backlog is published once every process holds a partition, so
all of them drain it at once; every ``0.01`` s the sampler counts ``pg_locks`` (entries of
every kind, fast-path ones included) and the backends holding them.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
from aiokafka import AIOKafkaProducer

from consumerkit import migrate
from tests.brokers import IDEMPOTENCE
from tests.torture import ledger
from tests.torture.procs import Proc, Procs

JOIN_TIMEOUT = 120.0
DRAIN_TIMEOUT = 180.0
ASSIGNED = re.compile(r"assigned \[(.*)\]")
Meter = Callable[[], dict[str, float]]
Prepare = Callable[["asyncpg.Connection[asyncpg.Record]"], Awaitable[None]]


@dataclass
class Drained:
    events: int
    seconds: float  # from the first record published to the last effect
    peak_entries: int
    peak_backends: int
    effects: int = 0
    distinct: int = 0
    violations: int = 0
    consumer_cpu: float = 0.0  # seconds, every consumer process, over ``seconds``
    metered: dict[str, float] = field(default_factory=dict)  # the meter's difference
    logs: dict[str, str] = field(default_factory=dict)


def _assignment(proc: Proc) -> str:
    """The partitions ``proc`` logged last as assigned ("" before any)."""
    found = ASSIGNED.findall(proc.log.read_text(errors="replace")) if proc.log.exists() else []
    return found[-1] if found else ""


def _cpu(pid: int) -> float:
    """CPU seconds of process ``pid`` so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def publish_backlog(bootstrap: str, topic: str, keys: int, per_key: int) -> int:
    """``keys x per_key`` ledger events, each key's sequence 1..per_key in order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20,
                                enable_idempotence=IDEMPOTENCE)
    await producer.start()
    try:
        sent = [await producer.send(
            topic, key=f"agg-{k}".encode(),
            headers=[("id", f"e-{k}-{s}".encode()), ("event_type", ledger.EVENT_TYPE.encode())],
            value=ledger.Step(aggregate=f"agg-{k}", seq=s).model_dump_json().encode())
            for s in range(1, per_key + 1) for k in range(keys)]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return len(sent)


async def _until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.2)


class _Sampler:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.entries = self.backends = 0
        self.done = asyncio.Event()

    async def run(self) -> None:
        observer = await asyncpg.connect(self.dsn)
        try:
            while not self.done.is_set():
                row = await observer.fetchrow(
                    "SELECT count(*) AS n, count(DISTINCT pid) AS b FROM pg_locks")
                assert row is not None
                self.entries = max(self.entries, row["n"])
                self.backends = max(self.backends, row["b"])
                await asyncio.sleep(0.01)
        finally:
            await observer.close()


async def drain(dsn: str, bootstrap: str, topic: str, schema: str, processes: int, *,
                keys: int, per_key: int, workdir: Path, meter: Meter | None = None,
                prepare: Prepare | None = None) -> Drained:
    """Migrate ``schema`` (new; then ``prepare`` runs), start ``processes`` consumers of
    ``topic`` (new, with a partition for each at least), publish the backlog once each holds
    a partition, and return once every event has an effect, the processes stopped."""
    conn = await asyncpg.connect(dsn)
    procs = Procs(workdir, "")
    try:
        await migrate(conn, schema)
        await ledger.create(conn, schema, keys)
        if prepare is not None:
            await prepare(conn)
        for i in range(processes):
            procs.add(f"consumer-{i}", "tests.torture.consumer_proc", "--dsn", dsn,
                      "--bootstrap", bootstrap, "--topic", topic, "--schema", schema,
                      "--max-in-flight", "5000", "--name", f"fleet-{schema}").start()
        consumers = procs.role("consumer")

        async def joined() -> bool:
            if not all(p.running() for p in consumers):
                raise RuntimeError("a consumer process died: " + ", ".join(
                    str(p.log) for p in consumers if not p.running()))
            return all(_assignment(p) for p in consumers)

        try:
            await _until(joined, JOIN_TIMEOUT, f"{processes} consumers in the group")
        except TimeoutError as exc:  # what each said last
            tails = "\n".join(f"{p.name}: {p.log.read_text(errors='replace')[-600:]}"
                              for p in consumers)
            raise TimeoutError(f"{exc}\n{tails}") from None
        sampler = _Sampler(dsn)
        sampling = asyncio.create_task(sampler.run())
        before = meter() if meter is not None else {}
        cpu = sum(_cpu(p.pid) for p in consumers)
        started = time.monotonic()
        events = await publish_backlog(bootstrap, topic, keys, per_key)
        count = f'SELECT count(*) FROM "{schema}".effects'

        async def drained() -> bool:
            if sampling.done():
                sampling.result()  # its error, if any
            return int(await conn.fetchval(count)) >= events

        await _until(drained, DRAIN_TIMEOUT, f"{events} effects")
        seconds = time.monotonic() - started
        cpu = sum(_cpu(p.pid) for p in consumers) - cpu
        after = meter() if meter is not None else {}
        sampler.done.set()
        await sampling
    finally:
        await asyncio.to_thread(procs.stop_all)
        await conn.close()
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            f'SELECT count(*) AS n, count(DISTINCT event_id) AS d FROM "{schema}".effects')
        violations = await conn.fetchval(f'SELECT count(*) FROM "{schema}".violations')
    finally:
        await conn.close()
    assert row is not None
    return Drained(
        events=events, seconds=seconds, peak_entries=sampler.entries,
        peak_backends=sampler.backends, effects=row["n"], distinct=row["d"],
        violations=violations, consumer_cpu=cpu,
        metered={k: after[k] - before[k] for k in after if k in before},
        logs={p.name: p.log.read_text(errors="replace") for p in consumers})
