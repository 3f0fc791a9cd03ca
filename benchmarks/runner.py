"""One measurement: a peer on its own group and fresh schema reads the whole published topic;
the run checks its effects and reads the counters around it. ``benchmark`` measures every
peer ``runs`` times, interleaved (in rotated orders, every other round backwards).

The measured window runs from the moment the first message reached the peer (stamped by the
hand-written and FastStream peers; for consumerkit, its ``stats.delivered`` sampled every
5 ms) to the last effect by the database's clock (the last message handled for the raw peer
and for replays). Group join and start-up are outside it. Rate = messages published,
duplicates included, over the window."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import asyncpg
from aiokafka import AIOKafkaConsumer

from .cpu import per_thousand, postmaster, reading
from .effects import Cost, create_schema, drop_schema, make_effect, wait_done
from .peers import FAST_GROUP, Peer, PeerEnv, group_name
from .pgstats import per_message, relation_bytes, snapshot, statements_available
from .report import Sample, Summary
from .workload import (
    KeySpread,
    Workload,
    create_topic,
    delete_topic,
    make_workload,
    publish,
)

Log = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Settings:
    events: int = 20_000
    keys: int = 1_000
    dup_rate: float = 0.05
    runs: int = 3
    partitions: int = 4
    deadline: float = 600.0  # seconds per peer and run, group join included
    seed: int = 7
    spread: KeySpread = "uniform"
    cost: Cost = "upsert"
    prefill: int = 0  # dedup rows of earlier events in the peer's table before it starts
    replay: bool = False  # measure the same consumer re-reading everything from offset 0
    redis_url: str | None = None


@dataclass(frozen=True, slots=True)
class Target:
    """What every measurement of one cell shares."""

    dsn: str
    bootstrap: str
    topic: str
    workload: Workload
    settings: Settings


async def benchmark(dsn: str, bootstrap: str, settings: Settings, peers: Sequence[type[Peer]],
                    log: Log = lambda _line: None) -> list[Summary]:
    """Publish the workload once, then measure every peer ``settings.runs`` times."""
    workload = make_workload(settings.events, settings.keys, settings.dup_rate, settings.seed,
                             settings.spread)
    topic = await create_topic(bootstrap, settings.partitions)
    try:
        started = time.monotonic()
        await publish(bootstrap, topic, workload)
        log(f"published {workload.size} messages ({workload.distinct} distinct, "
            f"{workload.duplicates} duplicates, {len(workload.totals)} keys) to {topic} "
            f"in {time.monotonic() - started:.1f}s")
        target = Target(dsn, bootstrap, topic, workload, settings)
        summaries = {p.name: Summary(p.name, p.description) for p in peers}
        for run in range(1, settings.runs + 1):
            for peer in run_order(peers, run):
                sample = await measure(peer, target, run)
                summaries[peer.name].samples.append(sample)
                log(f"run {run} {peer.name}: {sample.rate:,.0f} msg/s over "
                    f"{sample.seconds:.2f}s; {'exact' if sample.exact else 'WRONG'}: "
                    f"{sample.detail}")
        return [summaries[p.name] for p in peers]
    finally:
        await delete_topic(bootstrap, topic)


P = TypeVar("P")


def run_order(peers: Sequence[P], run: int) -> list[P]:
    """The order of the peers in round ``run`` (from 1): each even round runs the round
    before it backwards, and each odd round is rotated by one from the odd round before it, so
    that no peer always runs right after another (the database's after-effects of a heavy
    writer, such as autovacuum and checkpoints, would otherwise always fall on the same
    neighbour)."""
    shift = (run - 1) // 2 % len(peers)
    rotated = [*peers[shift:], *peers[:shift]]
    return rotated if run % 2 else rotated[::-1]


@contextlib.asynccontextmanager
async def fresh_schema(dsn: str, prefix: str) -> AsyncIterator[
        tuple[asyncpg.Connection[asyncpg.Record], str]]:
    """A connection and a fresh schema (effect and textbook tables), dropped afterwards."""
    schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
    conn = await asyncpg.connect(dsn, timeout=15)
    try:
        await create_schema(conn, schema)
        yield conn, schema
    finally:
        with contextlib.suppress(Exception):  # the numbers are taken; leftovers are harmless
            await drop_schema(conn, schema)
        await conn.close()


async def measure(peer_type: type[Peer], target: Target, run: int) -> Sample:
    s, workload = target.settings, target.workload
    async with fresh_schema(target.dsn, f"ckbench_{run}") as (conn, schema):
        group = group_name("ckbench", peer_type.name, str(run), schema[-8:])
        env = PeerEnv(target.dsn, target.bootstrap, target.topic, group, schema, workload,
                      make_effect(schema, s.cost), s.redis_url)
        peer = peer_type(env)
        deadline = time.monotonic() + s.deadline
        await peer.prepare(conn)
        if s.prefill and peer.uses_database:
            await peer.prefill(conn, s.prefill)
        if s.replay:  # the first pass is not measured: it only builds the state
            first = await consume(peer, conn, deadline)
            if first.error or not first.finished:
                return Sample(peer.name, run, workload.size, 0.0, False,
                              f"first pass before the replay: {first.error or 'not done'}")
            await rewind(target.bootstrap, target.topic, group, deadline)
            peer = peer_type(env)  # the same consumer (group, schema) restarted from offset 0
        counting = await statements_available(conn)
        size_before = await relation_bytes(conn, schema, peer.dedup_table)
        server = postmaster(await conn.fetchval("SELECT pg_backend_pid()"))
        before, cpu = await snapshot(conn, counting), reading(server)
        outcome = await consume(peer, conn, deadline)
        spent = reading(server)
        spent["process"] += peer.cpu_elsewhere
        cpu_spent = per_thousand(cpu, spent, workload.size)
        await asyncio.sleep(0.1)  # closed backends flush their statistics
        after = await snapshot(conn, counting)
        grown = await relation_bytes(conn, schema, peer.dedup_table) - size_before
        start = peer.began if peer.began is not None else outcome.first_received
        if peer.uses_database and not s.replay:
            end = await env.effect.last_at(conn)
        else:
            end = peer.ended if peer.began is not None else outcome.all_handled
        seconds = max(end - start, 0.0) if start is not None else 0.0
        if peer.uses_database:
            verdict = await env.effect.check(conn, workload)
            exact, detail = verdict.exact, verdict.detail
        else:
            exact = peer.handled() == workload.size
            detail = f"{peer.handled()} of {workload.size} messages consumed"
        if not outcome.finished:
            detail = f"not done by the deadline (or stalled short): {detail}"
        metrics = {**per_message(before, after, workload.size),
                   "dedup_bytes_per_million": grown / workload.size * 1e6,
                   **cpu_spent}
        return Sample(peer.name, run, workload.size, seconds,
                      outcome.finished and exact and not outcome.error,
                      outcome.error + detail, metrics)


@dataclass(frozen=True, slots=True)
class Outcome:
    finished: bool
    error: str
    first_received: float | None  # time.time() sampled every 5 ms, for peers without stamps
    all_handled: float


async def consume(peer: Peer, conn: asyncpg.Connection[asyncpg.Record],
                  deadline: float) -> Outcome:
    """Run ``peer`` until it has handled every message and every effect is there (or the
    deadline passes), then stop it and wait for it to close."""
    env, workload = peer.env, peer.env.workload
    poller = await asyncpg.connect(env.dsn, timeout=15)
    progress = _Progress()
    sampler = asyncio.create_task(progress.follow(peer, workload.size))
    try:
        task = asyncio.create_task(peer.run())
        done = asyncio.create_task(
            wait_done(poller, env.effect, workload, peer.handled, deadline)
            if peer.uses_database else _wait_handled(peer, workload.size, deadline))
        await asyncio.wait({task, done}, return_when=asyncio.FIRST_COMPLETED)
        finished = done.done() and not done.cancelled() and done.result()
        done.cancel()
        await asyncio.gather(done, return_exceptions=True)
    finally:
        poller.terminate()
    peer.stop.set()
    error = ""
    try:
        await asyncio.wait_for(task, 60)
    except Exception as exc:  # a failing peer is reported, not fatal
        error = f"peer failed: {type(exc).__name__}: {exc}; "
    sampler.cancel()
    await asyncio.gather(sampler, return_exceptions=True)
    return Outcome(bool(finished), error, progress.first, progress.last)


class _Progress:
    """When the peer was first handed a message and when it had handled them all, sampled
    every 5 ms (``time.time()``), for peers that do not stamp these themselves."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0

    async def follow(self, peer: Peer, size: int) -> None:
        while True:
            now = time.time()
            if self.first is None and peer.received():
                self.first = now
            self.last = now
            if peer.handled() >= size:
                return
            await asyncio.sleep(0.005)


async def _wait_handled(peer: Peer, size: int, deadline: float) -> bool:
    while peer.handled() < size:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def rewind(bootstrap: str, topic: str, group: str, deadline: float) -> None:
    """Join ``group`` (which has no other members), commit offset 0 on every partition it is
    assigned and leave: its next consumer starts from the beginning, as after a reset to an
    old offset. (Tansu refuses commits from outside the group's generation.)"""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False, **FAST_GROUP)
    await consumer.start()
    try:
        while not consumer.assignment():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no partitions assigned to {group} for the rewind")
            await consumer.getmany(timeout_ms=50, max_records=1)
        await consumer.commit(dict.fromkeys(consumer.assignment(), 0))
    finally:
        await consumer.stop()
