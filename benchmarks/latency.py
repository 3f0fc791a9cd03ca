"""End-to-end latency at a fixed offered load, below every peer's capacity.

A peer joins a fresh topic first; then the producer publishes one message every ``1 / rate``
seconds, each event on a key of its own, with ``time.time()`` as the record timestamp. An
event's latency is from that send time to its effect: the effect row's ``clock_timestamp()``
(stamped by the effect statement, just before the transaction commits), or for the in-process
effect and the raw peer the ``time.time()`` of the effect. Producer, database and peers share
this machine's clock.

``during`` runs an operation (a dedup cleanup, say) ``at`` seconds after publishing starts;
latencies are then split into events sent before it (baseline) and events sent while it ran
(at least one second from its start). Events sent in the first ``WARMUP`` seconds are not
counted.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from .effects import Cost, make_effect, wait_done
from .peers import Peer, PeerEnv, group_name
from .runner import fresh_schema
from .workload import Workload, create_topic, delete_topic, make_workload, publish_paced

WARMUP = 0.5
"""Seconds of sending at the start whose events are not counted (fetch sessions settle)."""

Setup = Callable[[Peer, "asyncpg.Connection[asyncpg.Record]"], Awaitable[None]]
During = Callable[[Peer], Awaitable[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Pace:
    events: int = 400
    rate: float = 200.0  # messages per second
    dup_rate: float = 0.1
    cost: Cost = "upsert"
    deadline: float = 120.0
    warmup: float = WARMUP  # seconds of sending at the start that are not counted


@dataclass(slots=True)
class Latencies:
    exact: bool
    detail: str
    points: list[tuple[float, float]] = field(default_factory=list)  # (sent, seconds)
    operation: dict[str, Any] = field(default_factory=dict)
    warmup: float = WARMUP

    def summary(self, start: float | None = None, end: float | None = None) -> dict[str, Any]:
        """Percentiles of the events sent in ``[start, end)``, warm-up excluded."""
        if self.points:
            start = max(start or 0.0, self.points[0][0] + self.warmup)
        values = sorted(lat for sent, lat in self.points
                        if (start is None or sent >= start) and (end is None or sent < end))
        if not values:
            return {"events": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
        return {"events": len(values), "p50_ms": percentile(values, 0.50) * 1000,
                "p99_ms": percentile(values, 0.99) * 1000, "max_ms": values[-1] * 1000}


def percentile(values: list[float], share: float) -> float:
    """Nearest-rank percentile of sorted ``values``."""
    return values[min(len(values) - 1, max(0, round(share * len(values) + 0.5) - 1))]


async def measure_latency(peer_type: type[Peer], dsn: str, bootstrap: str,
                          redis_url: str | None, pace: Pace, joined: Setup | None = None,
                          during: During | None = None, at: float = 0.0) -> Latencies:
    """``joined`` runs once the peer has its partitions, before the first message."""
    workload = make_workload(pace.events, pace.events, pace.dup_rate, seed=11)
    topic = await create_topic(bootstrap)
    try:
        async with fresh_schema(dsn, "ckbench_lat") as (conn, schema):
            env = PeerEnv(dsn, bootstrap, topic, group_name(
                "ckbench.lat", peer_type.name, uuid.uuid4().hex[:8]), schema, workload,
                          make_effect(schema, pace.cost), redis_url)
            peer = peer_type(env)
            await peer.prepare(conn)
            return await _paced(peer, conn, pace, joined, during, at)
    finally:
        await delete_topic(bootstrap, topic)


async def _paced(peer: Peer, conn: asyncpg.Connection[asyncpg.Record], pace: Pace,
                 joined: Setup | None, during: During | None, at: float) -> Latencies:
    workload, deadline = peer.env.workload, time.monotonic() + pace.deadline
    task = asyncio.create_task(peer.run())
    operation: asyncio.Task[dict[str, Any]] | None = None
    error = ""
    try:
        if not await _joined(peer, task, deadline):
            raise RuntimeError("the peer did not join its group")
        if joined is not None:
            await joined(peer, conn)
        if during is not None:
            operation = asyncio.create_task(_later(at, during, peer))
        sent = await publish_paced(peer.env.bootstrap, peer.env.topic, workload, pace.rate)
        if peer.uses_database:
            finished = await wait_done(conn, peer.env.effect, workload, peer.handled, deadline)
        else:
            finished = await _all_handled(peer, workload, deadline)
    except Exception as exc:  # reported with the peer, never fatal
        error, finished, sent = f"{type(exc).__name__}: {exc}; ", False, {}
    finally:
        peer.stop.set()
    try:
        await asyncio.wait_for(task, 60)
    except Exception as exc:
        error += f"peer failed: {type(exc).__name__}: {exc}; "
    result = await _judge(peer, conn, workload, sent)
    result.warmup = pace.warmup
    result.exact = result.exact and finished and not error
    result.detail = error + ("" if finished else "not done by the deadline: ") + result.detail
    if operation is not None:
        result.operation = await operation
    return result


async def _joined(peer: Peer, task: asyncio.Task[None], deadline: float) -> bool:
    """Wait until ``peer`` has its partitions (False if it died or the deadline passed)."""
    while not task.done() and time.monotonic() < deadline:
        if peer.ready():
            return True
        await asyncio.sleep(0.02)
    return False


async def _later(delay: float, during: During, peer: Peer) -> dict[str, Any]:
    await asyncio.sleep(delay)
    return await during(peer)


async def _all_handled(peer: Peer, workload: Workload, deadline: float) -> bool:
    while peer.handled() < workload.size:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _judge(peer: Peer, conn: asyncpg.Connection[asyncpg.Record], workload: Workload,
                 sent: dict[str, float]) -> Latencies:
    keys = {m.event_id: m.key for m in workload.messages}
    if peer.uses_database:
        verdict = await peer.env.effect.check(conn, workload)
        done_at = await peer.env.effect.first_at(conn)
        exact, detail = verdict.exact, verdict.detail
    else:
        done_at = peer.first_seen()
        exact = peer.handled() == workload.size
        detail = f"{peer.handled()} of {workload.size} messages consumed"
    points = sorted((t, done_at[keys[e]] - t) for e, t in sent.items() if keys[e] in done_at)
    return Latencies(exact, detail, points)

