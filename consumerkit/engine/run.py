"""A consumer's run, wired: what it opens before the engine starts and closes after it has
drained. :class:`~consumerkit.Consumer` holds the values; a :class:`Run` puts them to work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import TYPE_CHECKING

import asyncpg
from prometheus_client import CollectorRegistry

from ..deadletter.writer import DeadLetterWriter
from ..dedup.stores import store_for
from ..offsets import PostgresOffsets
from ..offsets.postgres import require_table
from ..offsets.recheck import Recheck
from ..parking.lot import ParkingLot, open_parking, parks
from ..shared import signals
from ..transport.kafka import KafkaSource
from ..transport.source import Source
from ..types import SinkResources
from .lifecycle import bounded, cancel, open_pool
from .observing import Observed, observe_consumer
from .pipeline import Pipeline
from .runner import Engine
from .stall import Breaker, StallPolicy
from .upkeep import DedupUpkeep, check_horizon

if TYPE_CHECKING:
    from ..consumer import Consumer

log = logging.getLogger("consumerkit.consumer")
# seconds between reads of the database's timeline behind a transaction pooler, where a
# failover may close none of the consumer's connections (consumerkit/offsets/recheck.py)
TIMELINE_POLL = 1.0


class Run:
    """What one :meth:`Consumer.run() <consumerkit.Consumer.run>` owns: the observers, the
    pool, the offsets' recheck, the engine and its source, the stop events. The consumer
    creates it for its run and reads its state through it; nothing else writes it."""

    def __init__(self, consumer: Consumer, dsn: str, bootstrap: str,
                 stop_requested: asyncio.Event) -> None:
        self.consumer = consumer
        self.dsn = dsn
        self.bootstrap = bootstrap
        self.stop_requested = stop_requested  # stop() or a signal, maybe before the run
        self.force = asyncio.Event()  # a second signal: abandon in-flight work
        self.ending = False  # the run ended, asked to or not: no longer ready
        self.observed: Observed | None = None
        self.engine: Engine | None = None
        self.recheck: Recheck | None = None

    async def serve(self, stack: contextlib.AsyncExitStack) -> None:
        """Open what the run uses, in order (observers, pool, dedup table, offsets, sinks,
        cache, parking, engine, source, upkeep), each closed by ``stack`` in reverse; run
        the engine until it stops, then drain it."""
        try:
            await self._serve(stack)
        finally:
            self.ending = True  # a start that failed ends the run too

    async def _serve(self, stack: contextlib.AsyncExitStack) -> None:
        consumer, dsn, bootstrap = self.consumer, self.dsn, self.bootstrap
        if consumer.metrics_port is not None and consumer.registry is None:
            consumer.registry = CollectorRegistry()  # one per consumer: no clash in a process
        observed = self.observed = await observe_consumer(
            stack, name=consumer.name, dsn=dsn, stats=consumer.stats,
            observers=consumer.observers, registry=consumer.registry,
            readiness=consumer.readiness, metrics_port=consumer.metrics_port,
            metrics_host=consumer.metrics_host, pooler=consumer.postgres_pooler)
        observer = observed.observer
        pool = await open_pool(dsn, consumer.name, consumer.concurrency + 2,
                               warm=consumer.concurrency, on_change=self.connections_changed,
                               pooler=consumer.postgres_pooler)
        stack.push_async_callback(pool.close)
        upkeep = DedupUpkeep(pool, consumer.schema, consumer.dedup, consumer.name, observer)
        await upkeep.prepare(auto_migrate=consumer.auto_migrate, outbox=consumer.outbox)
        if consumer.offset_store == "postgres":
            async with pool.acquire() as conn:
                await require_table(conn, consumer.schema)
            self.recheck = Recheck(
                PostgresOffsets(pool, consumer.schema, consumer.name), observer,
                skip_expired=consumer.dedup.expired == "skip",
                poll=TIMELINE_POLL if consumer.postgres_pooler == "transaction" else None)
        resources = SinkResources(pool, consumer.schema, bootstrap, consumer.kafka_options,
                                  tuple(consumer.topics))
        for sink in consumer.dead_letter:
            await sink.open(resources)
            stack.push_async_callback(sink.close)
        if consumer.dedup_cache is not None:
            consumer.dedup_cache.on_lookup = observer.cache_lookup  # it counts its answers
            await consumer.dedup_cache.open()
            stack.push_async_callback(consumer.dedup_cache.close)
        parking = await open_parking(stack, pool, consumer.schema, consumer.name, observer,
                                     parks(consumer.routes, consumer.retry),
                                     consumer.parking_interval)
        engine = self.engine = Engine(
            pipeline=pipeline_for(consumer, pool, observed, parking, self.recheck),
            max_in_flight=consumer.max_in_flight, batch_size=consumer.batch_size,
            max_batch=consumer.max_batch, revoke_timeout=consumer.revoke_timeout,
            keepalive=consumer.keepalive, stats=consumer.stats, parking=parking)
        if (recheck := self.recheck) is not None:  # the database keeps the offsets, checked
            recheck.owner = engine
            engine.commits.database, engine.commits.recheck = recheck.store, recheck
            rechecks = asyncio.create_task(recheck.run(pool, engine.stopping))
            stack.push_async_callback(cancel, rechecks)
        source: Source
        if consumer.source_factory is None:
            source = KafkaSource(
                topics=consumer.topics, group_id=consumer.name, bootstrap=bootstrap,
                options=consumer.kafka_consumer_options, rebalance=engine)
        else:
            source = consumer.source_factory(engine)
        # known before the join: a group joined fast calls on_assigned before the fetch loop
        # starts, and the ownerships must be placed at the stored offsets even then
        engine.source = engine.commits.source = source
        await source.start()
        stack.push_async_callback(bounded, source.stop, consumer.shutdown_timeout)
        if consumer.source_factory is None:  # Kafka's: the topics' retention is its to tell
            await check_horizon(consumer.dedup, topics=consumer.topics,
                                kafka_bootstrap=bootstrap, retry=consumer.retry,
                                handler_timeout=consumer.handler_timeout,
                                kafka_options=consumer.kafka_options)
        maintenance = asyncio.create_task(
            upkeep.run(consumer.maintenance_interval, engine.pipeline.maintenance_wanted))
        stack.push_async_callback(cancel, maintenance)
        observed.track_lag(stack, engine, source, consumer.lag_interval)
        if consumer.handle_signals:
            stack.callback(signals.install(self.on_signal))
        if self.stop_requested.is_set():
            engine.stopping.set()
        consumer.started.set()
        log.info("consumer %s started on %s", consumer.name, ", ".join(consumer.topics))
        try:
            await engine.run(source)
        finally:
            # whatever ended the run: no longer ready; a first signal now still drains
            self.ending = True
            await engine.drain(consumer.shutdown_timeout, self.force)
            log.info("consumer %s stopped: %s", consumer.name, consumer.stats)
            try:
                await consumer.readiness()  # "stopping", for the gauge and the log
            except Exception:  # nothing left to spoil, but the run's own error comes first
                log.exception("consumer %s: reporting its readiness failed", consumer.name)

    def request_stop(self) -> None:
        self.stop_requested.set()
        if self.engine is not None:
            self.engine.stopping.set()

    def on_signal(self, sig: signal.Signals) -> None:
        if self.stop_requested.is_set():
            log.warning("second %s: abandoning in-flight work now", sig.name)
            self.force.set()
            return
        log.info("%s received: finishing in-flight work, then stopping", sig.name)
        self.request_stop()

    def connections_changed(self) -> None:
        if self.recheck is not None:  # a server that moved back is found before any apply
            self.recheck.lost()

    async def readiness(self) -> str | None:
        """The reason the run is not ready, told to the observers when it changes."""
        reason = await self._readiness()
        if self.observed is not None:
            self.observed.tell(reason)  # observers hear of changes only
        return reason

    async def _readiness(self) -> str | None:
        if self.ending or self.stop_requested.is_set():
            return "stopping"
        if (not self.consumer.started.is_set() or self.engine is None
                or self.observed is None):
            return "starting"
        if not self.engine.joined.is_set():
            return f"waiting to join consumer group {self.consumer.name}"
        breaker = self.engine.pipeline.breaker
        if breaker is not None and (stalled := breaker.reason) is not None:
            return f"stalled: {stalled}"
        # its own connection: a busy pool must not make the consumer look unready
        return await self.observed.probe.check()


def pipeline_for(consumer: Consumer, pool: asyncpg.Pool, observed: Observed,
             parking: ParkingLot | None = None, offsets: Recheck | None = None,
             ) -> Pipeline:
    return Pipeline(
        consumer=consumer.name, namespace=consumer.name, pool=pool,
        dedup=store_for(consumer.schema, consumer.dedup),
        decoder=consumer.decoder(),
        retry=consumer.retry, dead_letters=DeadLetterWriter(consumer.dead_letter),
        expired=consumer.dedup.expired, stats=consumer.stats, concurrency=consumer.concurrency,
        handler_timeout=consumer.handler_timeout, cache=consumer.dedup_cache,
        outbox=consumer.outbox,
        observer=observed.observer, tracing=observed.tracing, parking=parking,
        breaker=Breaker(stall_policy(consumer), observed.observer), offsets=offsets)

def stall_policy(consumer: Consumer) -> StallPolicy:
    """The stall's back-off: the retry policy's, from at least 0.1 s (0 would spin), up
    to ``stall_max_delay``."""
    initial = min(max(consumer.retry.initial_delay, 0.1), consumer.stall_max_delay)
    return StallPolicy(after_keys=consumer.stall_after_keys, initial_delay=initial,
                       multiplier=consumer.retry.multiplier, max_delay=consumer.stall_max_delay)
