"""One torture run: services, processes, then the phases warm-up, chaos, heal, drain (judged
from the database), final read of the topic, check. Returns the report as a dict."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer

from consumerkit import migrate
from consumerkit.outbox import OutboxTable
from consumerkit.testing.services import TansuBroker
from consumerkit.transport.kafka_admin import create_topic
from tests.harness.from_zero import assign_from_zero
from tests.harness.kafka import KafkaCluster

from . import ledger, txn_outcomes
from .check import check, transactions
from .cluster import Database, OwnPostgres, OwnRedis, ReplicatedCluster, start_tansu
from .consumer_proc import KAFKA_MUTANT_ENV
from .faults import FAILOVER_KINDS, KINDS, REDIS_KINDS, Rig, schedule
from .kafka_faults import KAFKA_KINDS, KAFKA_MUTANTS, start_cluster
from .kafka_faults import create_topic as create_kafka_topic
from .pooler import POOLER_KINDS, Bouncer
from .procs import Proc, Procs
from .profiles import Profile
from .trace import rereads
from .witness import Witness

SCHEMA = "torture"
TOPIC = "torture.steps"
CONSUMERS = 3
RELAYS = 2
FAULT_TIMEOUT = 60.0
FAULTS = {**KINDS, **KAFKA_KINDS, **POOLER_KINDS}

log = logging.getLogger("torture")


async def _db(dsn: str, attempts: int = 50) -> asyncpg.Connection[asyncpg.Record]:
    """A connection, waiting out a restart in progress."""
    for attempt in range(attempts):
        try:
            return await asyncpg.connect(dsn, timeout=10)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.2)
    raise AssertionError("unreachable")


async def _setup(dsn: str, bootstrap: str, profile: Profile) -> None:
    conn = await _db(dsn)
    try:
        await migrate(conn, SCHEMA)
        await migrate(conn, dedup=None, outboxes=[OutboxTable(SCHEMA)])
        await ledger.create(conn, SCHEMA, profile.aggregates)
    finally:
        await conn.close()
    if profile.broker == "kafka":
        await create_kafka_topic(bootstrap, TOPIC, profile.partitions)
    else:
        await create_topic(bootstrap, TOPIC, profile.partitions)


def _processes(procs: Procs, dsn: str, bootstrap: str, redis_url: str,
               profile: Profile, seed: int, pooler: str) -> None:
    for i in range(RELAYS):
        procs.add(f"relay-{i}", "tests.outbox.relay_worker", "--dsn", dsn, "--bootstrap",
                  bootstrap, "--schema", SCHEMA, "--topic", TOPIC, "--name", f"r{i}",
                  "--pooler", pooler)
    for i in range(CONSUMERS + 1):  # the last one is the spare that joins and leaves
        # the odd ones apply through a batch handler with ctx.defer, the others one by one;
        # consumer-2 gives every record a transaction of its own (max_batch=1)
        batch = ["--batch"] if i % 2 else ["--max-batch", "1"] if i == 2 else []
        procs.add(f"consumer-{i}", "tests.torture.consumer_proc", "--dsn", dsn,
                  "--bootstrap", bootstrap, "--topic", TOPIC, "--schema", SCHEMA,
                  "--redis", redis_url, "--offset-store", profile.offset_store,
                  "--pooler", pooler, *batch)
    procs.add("producer", "tests.torture.producer_proc", "--dsn", dsn, "--schema", SCHEMA,
              "--events", str(profile.events), "--aggregates", str(profile.aggregates),
              "--rate", str(profile.rate), "--seed", str(seed), "--pooler", pooler)


async def _wait(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.2)


async def _stop_behind(procs: list[Proc], grace: float = 30.0) -> int:
    """The transactional writers keep their own pace, which a loaded machine slows: once the
    outbox's producer is done they have ``grace`` seconds, then are killed (a crash to them:
    the final read of the topic decides what they had in flight). Returns how many were."""
    async def ended() -> bool:
        return not any(p.running() for p in procs)

    with contextlib.suppress(TimeoutError):
        await _wait(ended, grace, "the transactional writers")
    behind = [p for p in procs if p.running()]
    for proc in behind:
        log.info("%s stopped behind the producer", proc.name)
        proc.kill()
    return len(behind)


async def _progress(dsn: str) -> tuple[int, int, int]:
    conn = await _db(dsn)
    try:
        return await ledger.progress(conn, SCHEMA)
    finally:
        await conn.close()


async def _chaos(rig: Rig, plan: list[str], profile: Profile) -> tuple[Counter[str], int]:
    done: Counter[str] = Counter()
    missed = 0
    keep = rig.procs.role("consumer")[:CONSUMERS] + rig.procs.role("relay")
    for kind in plan:
        await asyncio.sleep(profile.fault_gap * rig.rng.uniform(0.5, 1.5))  # the schedule
        try:
            async with asyncio.timeout(FAULT_TIMEOUT):
                happened = await FAULTS[kind](rig)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
            log.warning("fault %s did not complete: %r", kind, exc)
            happened = False
        if happened:
            done[kind] += 1
        else:
            missed += 1
        rig.procs.revive(keep)
        log.info("fault %s %s", kind, "done" if happened else "missed")
    return done, missed


async def _heal(rig: Rig) -> None:
    await asyncio.gather(*rig.held, return_exceptions=True)
    if rig.redis is not None and not rig.redis.pongs():
        await asyncio.to_thread(rig.redis.start)
    if rig.spare.running():
        await asyncio.to_thread(rig.spare.stop)
    keep = rig.procs.role("consumer")[:CONSUMERS] + rig.procs.role("relay")
    for proc in keep:
        if proc.running():
            proc.arm("")
    rig.procs.revive(keep)


async def _drain(dsn: str, profile: Profile) -> tuple[float, bool]:
    """Until every committed event is settled and the outbox is empty (from the database),
    or nothing moved for ``stall_timeout``; (seconds, drained)."""
    started = last_change = time.monotonic()
    last: tuple[int, int, int] | None = None
    while True:
        now = await _progress(dsn)
        if now[0] == 0 and now[1] == 0:
            return time.monotonic() - started, True
        if now != last:
            last, last_change = now, time.monotonic()
        elapsed = time.monotonic() - started
        if time.monotonic() - last_change > profile.stall_timeout or (
                elapsed > profile.drain_timeout):
            log.warning("drain gave up after %.0fs: %s unsettled, %s in the outbox",
                        elapsed, now[0], now[1])
            return elapsed, False
        await asyncio.sleep(0.5)


async def _read_topic(bootstrap: str, wanted: int,
                      isolation: str = "read_uncommitted") -> list[tuple[int, int, str]]:
    """(partition, offset, event id) of every record on the topic: reads until it has
    ``wanted`` distinct ids and two polls find nothing more (eight if it has fewer), or 60 s
    pass. With transactional producers upstream, read_committed: what they committed."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                              enable_auto_commit=False, isolation_level=isolation)
    await reader.start()
    read: list[tuple[int, int, str]] = []
    ids: set[str] = set()
    try:
        await assign_from_zero(reader, [TOPIC])
        deadline = time.monotonic() + 60
        quiet = 0
        while quiet < 8 and time.monotonic() < deadline:
            batch = await reader.getmany(timeout_ms=500, max_records=5000)
            for records in batch.values():
                for r in records:
                    event_id = dict(r.headers).get("id", b"").decode()
                    read.append((r.partition, r.offset, event_id))
                    ids.add(event_id)
            # complete: two empty polls; short of it (a lost event): eight, then give up
            quiet = quiet + (4 if len(ids) >= wanted else 1) if not batch else 0
    finally:
        await reader.stop()
    return read


def _positions(read: list[tuple[int, int, str]], event_ids: list[str]) -> list[str]:
    """``TOPIC/PARTITION:OFFSET`` of each of ``event_ids`` on the topic (its first copy)."""
    first: dict[str, tuple[int, int]] = {}
    for partition, offset, event_id in read:
        first.setdefault(event_id, (partition, offset))
    return [f"{TOPIC}/{first[e][0]}:{first[e][1]}" for e in event_ids if e in first]


async def torture(profile: Profile, seed: int, mutant: str, keep: bool = False,
                  pooler: str = "none") -> dict[str, Any]:
    """``pooler="transaction"``: the consumers, relays and producers through a PgBouncer in
    transaction mode (:mod:`tests.torture.pooler`), and its faults among the kinds."""
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="ck-torture-"))
    postgres: Database = await asyncio.to_thread(
        ReplicatedCluster if profile.failover else OwnPostgres)
    kafka = profile.broker == "kafka"
    broker: TansuBroker | KafkaCluster = await asyncio.to_thread(
        start_cluster) if kafka else await asyncio.to_thread(start_tansu)
    redis = OwnRedis() if profile.cache else None
    bouncer = await asyncio.to_thread(Bouncer, postgres) if pooler == "transaction" else None
    procs = Procs(workdir, "" if mutant in KAFKA_MUTANTS else mutant)
    phases: dict[str, float] = {}
    try:
        if redis is not None:
            await asyncio.to_thread(redis.start)
        await _setup(postgres.dsn, broker.bootstrap, profile)
        _processes(procs, bouncer.dsn if bouncer else postgres.dsn, broker.bootstrap,
                   redis.url if redis else "", profile, seed, pooler)
        if profile.txn_events:
            procs.add("txn-producer", "tests.torture.txn_producer_proc", "--dsn",
                      postgres.dsn, "--bootstrap", broker.bootstrap, "--schema", SCHEMA,
                      "--topic", TOPIC, "--events", str(profile.txn_events), "--rate",
                      str(profile.txn_events * profile.rate / profile.events),
                      "--seed", str(seed))
        if mutant in KAFKA_MUTANTS:
            for proc in procs.role("consumer"):
                proc.env[KAFKA_MUTANT_ENV] = mutant
        rig = Rig(procs, postgres, broker, redis, SCHEMA, TOPIC, rng,
                  spare=procs.by_name[f"consumer-{CONSUMERS}"], bouncer=bouncer)
        for proc in procs.role("relay") + procs.role("consumer")[:CONSUMERS]:
            proc.start()
        witness = Witness(broker.bootstrap, TOPIC, profile.partitions)
        witness.start()
        producer = procs.by_name["producer"]
        producer.start()
        upstream = [producer, *procs.role("txn-producer")]
        for proc in upstream[1:]:
            proc.start()
        started = time.monotonic()

        async def applying() -> bool:
            return (await _progress(postgres.dsn))[2] > 0

        await _wait(applying, 90, "the first effect (warm-up)")
        await asyncio.sleep(profile.warmup)  # the warm-up: a span without faults
        phases["warmup_s"] = time.monotonic() - started

        kinds = [k for k in profile.kinds or KINDS if (profile.cache or k not in REDIS_KINDS)
                 and (profile.failover or k not in FAILOVER_KINDS)]
        kinds += list(POOLER_KINDS) if bouncer else []
        plan = schedule(kinds, profile.faults, rng)
        mark = time.monotonic()
        faults, missed = await _chaos(rig, plan, profile)

        async def produced() -> bool:
            return not producer.running()

        await _wait(produced, profile.events / profile.rate * 3 + 120, "the producer")
        writers_stopped = await _stop_behind(upstream[1:])
        phases["chaos_s"] = time.monotonic() - mark

        mark = time.monotonic()
        await _heal(rig)
        phases["heal_s"] = time.monotonic() - mark
        if profile.txn_events:  # so that the drain waits for the effects of those committed
            conn = await _db(postgres.dsn)
            try:
                await txn_outcomes.settle(conn, broker.bootstrap, SCHEMA, TOPIC,
                                          profile.partitions)
            finally:
                await conn.close()
        drain_s, drained = await _drain(postgres.dsn, profile)
        phases["drain_s"] = drain_s
        procs.stop_all()
        gap_rereads, reread_hidden, gaps_explained = rereads(workdir)

        conn = await _db(postgres.dsn)
        try:
            history = await ledger.read_history(conn, SCHEMA)
            p50, p99 = await ledger.latency_ms(conn, SCHEMA)
        finally:
            await conn.close()
        mark = time.monotonic()
        read = await _read_topic(broker.bootstrap, len(history.committed),
                                 "read_committed" if kafka else "read_uncommitted")
        history.published = [event_id for _, _, event_id in read]
        phases["final_read_s"] = time.monotonic() - mark
        await witness.stop()
        hidden = witness.hidden(read)
        at = {(p, o) for p, o, _ in hidden}
        shown = {event_id for p, o, event_id in read if (p, o) not in at}
        conn = await _db(postgres.dsn)
        try:
            txns = transactions(history, await ledger.read_txn_events(conn, SCHEMA),
                               {event_id for _, _, event_id in read})
        finally:
            await conn.close()
        history.broker_hidden = {event_id for _, _, event_id in hidden} - shown
        history.republished = rig.republished
        history.raw_poison = rig.raw_poison
        failovers = postgres.failovers if isinstance(postgres, ReplicatedCluster) else 0
        history.failovers = failovers
        findings = check(history)
        exits = {p.name: p.unexpected_exits for p in procs.by_name.values()
                 if p.unexpected_exits}
        return {
            "profile": profile.name, "seed": seed, "mutant": mutant or None, "pooler": pooler,
            "pooler_restarts": bouncer.restarts if bouncer else 0,
            "events_committed": findings.events_committed,
            "poison_committed": findings.poison_committed,
            "raw_poison_records": len(rig.raw_poison),
            "relay_duplicates": findings.relay_duplicates,
            "republished_copies": rig.republished,
            "deliveries_total": findings.deliveries_total,
            "deliveries_distinct": findings.deliveries_distinct,
            "unpublished": findings.unpublished,
            "effects": findings.effects,
            "duplicate_effects": findings.duplicate_effects,
            "lost": findings.lost,
            "witness_read": len(witness.seen),  # records the witness saw while streaming
            "broker_hidden": len(hidden),
            "broker_hidden_examples": [list(h) for h in hidden[:5]],
            "lost_hidden_by_broker": findings.lost_hidden,
            # gaps the consumers read again, and the records found there (docs/ordering-and-
            # offsets.md#gaps): what the broker hid from them, and they did not lose
            "consumer_gap_rereads": gap_rereads,
            "consumer_reread_hidden": reread_hidden,
            "consumer_gaps_explained": gaps_explained,
            "phantom": findings.phantom,
            "order_violations": findings.order_violations,
            "projection_violations": findings.projection_violations,
            "dead_lettered": findings.dead_lettered,
            "unexpected_dead_letters": findings.unexpected_dead_letters,
            "parked": findings.parked,
            "broker": profile.broker,
            # transactional producers upstream: their records by outcome (an unknown commit
            # is decided by a read_committed read of the topic) and aborted ones applied
            "txn_records": txns,
            "txn_writers_stopped": writers_stopped,
            "aborted_applied": findings.aborted_applied,
            "faults_total": sum(faults.values()),
            "fault_kinds": len(faults),
            "faults_by_kind": dict(sorted(faults.items())),
            "faults_not_reached": missed,
            "postgres_restarts": postgres.restarts,
            "offset_store": profile.offset_store,
            "failovers": failovers,
            # events the relay published from rows a failover then took back: on the topic,
            # with no source transaction (docs/failover.md), and what they did downstream
            "orphan_events": findings.orphans,
            "orphan_effects": findings.orphan_effects,
            "orphan_projection_violations": findings.orphan_violations,
            "drained": drained,
            "time_to_drain_s": round(drain_s, 2),
            "latency_ms": {"p50": round(p50, 1), "p99": round(p99, 1)},
            "phases_s": {k: round(v, 2) for k, v in phases.items()},
            "unexpected_exits": exits,
            "examples": findings.examples,
            # where the lost events are on the topic, for `python -m tests.torture.trace`
            "lost_positions": _positions(read, findings.lost_ids)[:50],
            "verdict": findings.verdict,
        }
    finally:
        procs.stop_all()
        if redis is not None:
            redis.stop()
        broker.stop()
        if bouncer is not None:
            bouncer.stop(keep=keep)
        postgres.stop(keep=keep)
        if keep:
            log.warning("process logs kept in %s, the database in %s", workdir,
                        postgres.pgdata)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
