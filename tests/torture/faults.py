"""The faults, and their seeded schedule. Each fault is an async function of the :class:`Rig`
that returns True once it happened (a fail-point that was never reached within its time did
not happen, and is not counted). Every wait is bounded."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from consumerkit.outbox import NewEvent, Outbox
from consumerkit.shared.identifiers import identifier
from tests.harness.kafka import KafkaCluster

from .cluster import Database, OwnRedis, ReplicatedCluster, TansuBroker, pause_process
from .ledger import EVENT_TYPE
from .procs import Proc, Procs
from .zombie import zombie_after_claim

if TYPE_CHECKING:
    from .pooler import Bouncer

SESSION_TIMEOUT = 3.0  # the consumers' session_timeout_ms, in seconds
FAILPOINT_WAIT = 8.0  # how long an armed fail-point may take to be reached
ARM_AFTER = 3.0  # seconds a process must have run before a fail-point is armed in it
HOLD_BACK = 2.0  # seconds the standby misses every commit before the primary is killed
HELD_EFFECTS = 20  # effects applied on the primary alone before that
HOLD_BACK_MAX = 20.0  # the most a failover waits for them


@dataclass
class Rig:
    """What the faults act on."""

    procs: Procs
    postgres: Database
    broker: TansuBroker | KafkaCluster
    redis: OwnRedis | None
    schema: str
    topic: str
    rng: random.Random
    spare: Proc  # the consumer that joins and leaves the group
    republished: int = 0
    raw_poison: set[str] = field(default_factory=set)
    held: list[asyncio.Task[None]] = field(default_factory=list)
    bouncer: Bouncer | None = None  # the PgBouncer in front of PostgreSQL (--pooler)

    def consumers(self) -> list[Proc]:
        return [p for p in self.procs.role("consumer") if p.running()]

    def pick(self, procs: list[Proc]) -> Proc:
        return procs[self.rng.randrange(len(procs))]

    async def connect(self) -> asyncpg.Connection[asyncpg.Record]:
        return await asyncpg.connect(self.postgres.dsn, timeout=10)


Fault = Callable[[Rig], Awaitable[bool]]


async def consumer_kill(rig: Rig) -> bool:
    proc = rig.pick(rig.consumers())
    await asyncio.to_thread(proc.kill)
    proc.start()
    return True


def _failpoint(point: str, role: str = "consumer") -> Fault:
    async def fire(rig: Rig) -> bool:
        procs = rig.consumers() if role == "consumer" else [
            p for p in rig.procs.role(role) if p.running()]
        # one that has had time to import consumerkit (before that, SIGUSR1 would kill it)
        settled = [p for p in procs if time.monotonic() - p.started_at > ARM_AFTER]
        proc = rig.pick(settled or procs)
        proc.arm(point)
        if not await asyncio.to_thread(proc.died_within, FAILPOINT_WAIT):
            proc.arm("")  # not reached in time: disarmed, not counted
            return False
        proc.start()
        return True

    fire.__name__ = f"failpoint_{point}"
    return fire


async def consumer_zombie(rig: Rig) -> bool:
    """Frozen past the session timeout: thrown out of the group, then it wakes up and must not
    apply what its successor now owns."""
    proc = rig.pick(rig.consumers())
    await asyncio.to_thread(pause_process, proc.pid, SESSION_TIMEOUT * 1.7)
    return True


async def membership_churn(rig: Rig) -> bool:
    if rig.spare.running():
        await asyncio.to_thread(rig.spare.stop)
    else:
        rig.spare.start()
    return True


def _terminate(pattern: str) -> Fault:
    async def fire(rig: Rig) -> bool:
        conn = await rig.connect()
        try:
            killed = await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name LIKE $1 AND pid <> pg_backend_pid()", pattern)
        finally:
            await conn.close()
        return bool(killed)

    return fire


async def postgres_restart(rig: Rig) -> bool:
    await asyncio.to_thread(rig.postgres.restart)
    return True


async def postgres_failover(rig: Rig) -> bool:
    """The standby misses the commits of a few seconds (consumers apply records and commit
    their offsets, relays publish and delete rows, producers write, all on the primary alone);
    then the primary dies and the standby is promoted: those commits are gone."""
    if not isinstance(rig.postgres, ReplicatedCluster):
        return False
    pair = rig.postgres.pair
    before = await _effects(rig)
    pair.hold_back()
    # The fault needs effects the standby lacks: a consumer just killed or rebalancing may
    # apply nothing for seconds, so wait (bounded) until some are applied on the primary alone,
    # then long enough for their offsets to be committed after them.
    deadline = time.monotonic() + HOLD_BACK_MAX
    while await _effects(rig) < before + HELD_EFFECTS and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await asyncio.sleep(HOLD_BACK)
    await asyncio.to_thread(rig.postgres.fail_over)
    return True


async def _effects(rig: Rig) -> int:
    conn = await rig.connect()
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {identifier(rig.schema)}.effects"))
    finally:
        await conn.close()


async def redis_flushall(rig: Rig) -> bool:
    assert rig.redis is not None
    await asyncio.to_thread(rig.redis.client().flushall)
    return True


async def redis_kill(rig: Rig) -> bool:
    assert rig.redis is not None
    await asyncio.to_thread(rig.redis.kill)
    await asyncio.sleep(1.0)  # consumers go on without the cache meanwhile
    await asyncio.to_thread(rig.redis.start)
    return True


async def redis_pause(rig: Rig) -> bool:
    assert rig.redis is not None
    assert rig.redis.process is not None
    await asyncio.to_thread(pause_process, rig.redis.process.pid, 2.0)
    return True


async def broker_pause(rig: Rig) -> bool:
    """The broker frozen for 4 s (on Kafka, one node of three), then resumed."""
    if isinstance(rig.broker, KafkaCluster):
        nodes = rig.broker.nodes
        pid = nodes[rig.rng.randrange(len(nodes))].pid
    else:
        pid = rig.broker.pid
    if pid is None:
        return False
    await asyncio.to_thread(pause_process, pid, 4.0)
    return True


async def long_transaction(rig: Rig) -> bool:
    """A producer transaction held open for seconds: its outbox row gets a low seq and
    commits after many higher ones were published (a relay reading ``seq > cursor`` skips
    it). It runs in the background while the schedule goes on."""
    conn = await rig.connect()
    aggregate = f"agg-{rig.rng.randrange(10)}"

    async def hold() -> None:
        try:
            tx = conn.transaction()
            await tx.start()
            seq = await conn.fetchval(
                f'UPDATE "{rig.schema}".counters SET n = n + 1 WHERE aggregate = $1 '
                "RETURNING n", aggregate)
            await _add(conn, rig.schema, aggregate, seq, poison=False)
            await asyncio.sleep(3.0)  # the fault: a long transaction
            await tx.commit()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            pass  # a database fault ended it first: then nothing of it committed
        finally:
            conn.terminate()

    rig.held.append(asyncio.create_task(hold()))
    return True


async def poison(rig: Rig) -> bool:
    """A poison event through the outbox, and a malformed record straight on the topic."""
    conn = await rig.connect()
    try:
        async with conn.transaction():
            await _add(conn, rig.schema, f"poison-{uuid.uuid4().hex[:8]}", 0, poison=True)
    finally:
        await conn.close()
    raw = f"raw-{uuid.uuid4()}"
    producer = AIOKafkaProducer(bootstrap_servers=rig.broker.bootstrap, acks="all",
                                enable_idempotence=False)
    await producer.start()
    try:
        await producer.send_and_wait(rig.topic, b"{not json", key=b"poison", headers=[
            ("id", raw.encode()), ("event_type", EVENT_TYPE.encode())])
    finally:
        await producer.stop()
    rig.raw_poison.add(raw)
    return True


async def _add(conn: asyncpg.Connection[asyncpg.Record], schema: str, aggregate: str,
               seq: int, *, poison: bool) -> None:
    event_id = uuid.uuid4()
    await conn.execute(
        f'INSERT INTO "{schema}".business (event_id, aggregate, seq, poison) '
        "VALUES ($1, $2, $3, $4)", str(event_id), aggregate, seq, poison)
    await Outbox(schema).add_many(conn, [NewEvent(
        EVENT_TYPE, "ledger", aggregate, {"aggregate": aggregate, "seq": seq, "poison": poison},
        event_id=event_id)])


async def republish(rig: Rig) -> bool:
    """Copies of records already on the topic, sent again as a misbehaving upstream would."""
    # read_committed: a copy of an aborted transaction's record would be a committed one
    reader = AIOKafkaConsumer(rig.topic, bootstrap_servers=rig.broker.bootstrap, group_id=None,
                              auto_offset_reset="earliest", enable_auto_commit=False,
                              isolation_level="read_committed")
    await reader.start()
    try:
        batch = await reader.getmany(timeout_ms=2000, max_records=200)
    finally:
        await reader.stop()
    records = [r for rs in batch.values() for r in rs if dict(r.headers).get("id")]
    chosen = rig.rng.sample(records, min(30, len(records)))
    if not chosen:
        return False
    producer = AIOKafkaProducer(bootstrap_servers=rig.broker.bootstrap, acks="all",
                                enable_idempotence=False)
    await producer.start()
    try:
        for r in chosen:
            await producer.send_and_wait(r.topic, r.value, key=r.key, partition=r.partition,
                                         headers=list(r.headers))
    finally:
        await producer.stop()
    rig.republished += len(chosen)
    return True


KINDS: dict[str, Fault] = {
    "consumer_sigkill": consumer_kill,
    "failpoint_after_claim": _failpoint("after_claim"),
    "failpoint_before_commit": _failpoint("before_commit"),
    "failpoint_after_commit": _failpoint("after_commit"),
    "failpoint_after_cache_write": _failpoint("after_cache_write"),
    "consumer_zombie": consumer_zombie,
    "zombie_after_claim": zombie_after_claim,
    "membership_churn": membership_churn,
    "pg_terminate_consumers": _terminate("consumerkit:%"),
    "pg_terminate_relays": _terminate("consumerkit-relay%"),
    "postgres_restart": postgres_restart,
    "postgres_failover": postgres_failover,
    "redis_flushall": redis_flushall,
    "redis_kill": redis_kill,
    "redis_pause": redis_pause,
    "relay_sigkill_after_publish": _failpoint("relay_after_publish", role="relay"),
    "broker_pause": broker_pause,
    "long_transaction": long_transaction,
    "poison": poison,
    "republish": republish,
}
REDIS_KINDS = {"failpoint_after_cache_write", "redis_flushall", "redis_kill", "redis_pause"}
FAILOVER_KINDS = {"postgres_failover"}  # they need the replicated cluster


def schedule(kinds: list[str], count: int, rng: random.Random) -> list[str]:
    """``count`` faults: every kind once per round, in a seeded order per round."""
    plan: list[str] = []
    while len(plan) < count:
        round_ = list(kinds)
        rng.shuffle(round_)
        plan.extend(round_)
    return plan[:count]

