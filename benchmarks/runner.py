"""One benchmark run: publish the workload once, then measure every peer ``runs`` times,
interleaved (the order rotates each round), each on its own group and fresh schema."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import asyncpg

from .effects import check, create_schema, drop_schema, wait_done, window
from .peers import Peer, PeerEnv
from .report import Sample, Summary
from .workload import Workload, create_topic, delete_topic, make_workload, publish


@dataclass(frozen=True, slots=True)
class Settings:
    events: int = 20_000
    keys: int = 1_000
    dup_rate: float = 0.05
    runs: int = 3
    partitions: int = 4
    deadline: float = 600.0  # seconds per peer and run, group join included
    seed: int = 7


async def benchmark(dsn: str, bootstrap: str, settings: Settings, peers: Sequence[type[Peer]],
                    log: Callable[[str], None] = lambda _line: None) -> list[Summary]:
    workload = make_workload(settings.events, settings.keys, settings.dup_rate, settings.seed)
    topic = await create_topic(bootstrap, settings.partitions)
    try:
        started = time.monotonic()
        await publish(bootstrap, topic, workload)
        log(f"published {workload.size} messages ({workload.distinct} distinct, "
            f"{workload.duplicates} duplicates, {len(workload.totals)} keys) to {topic} "
            f"in {time.monotonic() - started:.1f}s")
        summaries = {p.name: Summary(p.name, p.description) for p in peers}
        for run in range(1, settings.runs + 1):
            shift = (run - 1) % len(peers)
            for peer in [*peers[shift:], *peers[:shift]]:
                sample = await measure(peer, dsn, bootstrap, topic, workload, run,
                                       settings.deadline)
                summaries[peer.name].samples.append(sample)
                log(f"run {run} {peer.name}: {sample.rate:,.0f} msg/s over "
                    f"{sample.seconds:.2f}s; {'exact' if sample.exact else 'WRONG'}: "
                    f"{sample.detail}")
        return [summaries[p.name] for p in peers]
    finally:
        await delete_topic(bootstrap, topic)


async def measure(peer_type: type[Peer], dsn: str, bootstrap: str, topic: str,
                  workload: Workload, run: int, deadline: float) -> Sample:
    tag = uuid.uuid4().hex[:8]
    schema = f"ckbench_{run}_{tag}"
    env = PeerEnv(dsn, bootstrap, topic, f"ckbench.{peer_type.name}.{run}.{tag}", schema,
                  workload)
    conn = await asyncpg.connect(dsn, timeout=15)
    try:
        await create_schema(conn, schema)
        return await _measure(peer_type(env), conn, run, time.monotonic() + deadline)
    finally:
        await drop_schema(conn, schema)
        await conn.close()


async def _measure(peer: Peer, conn: asyncpg.Connection[asyncpg.Record], run: int,
                   deadline: float) -> Sample:
    env, workload = peer.env, peer.env.workload
    poller = await asyncpg.connect(env.dsn, timeout=15)
    try:
        task = asyncio.create_task(peer.run())
        done = asyncio.create_task(
            wait_done(poller, env.schema, workload, peer.handled, deadline)
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
    if peer.uses_database:
        verdict = await check(conn, env.schema, workload)
        seconds = await window(conn, env.schema)
        exact, detail = verdict.exact, verdict.detail
    else:
        seconds = peer.elapsed()
        exact = peer.handled() == workload.size
        detail = f"{peer.handled()} of {workload.size} messages consumed"
    if not finished:
        detail = f"not done by the deadline (or stalled short): {detail}"
    return Sample(peer.name, run, workload.size, seconds, finished and exact and not error,
                  error + detail)


async def _wait_handled(peer: Peer, size: int, deadline: float) -> bool:
    while peer.handled() < size:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True
