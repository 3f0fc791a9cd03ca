"""consumerkit as a peer: its defaults, with the Redis cache in front, and its best settings.
Every consumerkit peer keeps its offsets in Kafka (``offset_store="kafka"``) unless its options
say otherwise; ``consumerkit-pg-offsets`` runs the default offset store.

A setting the installed consumerkit does not accept (an API not there yet) makes the peer
report itself unavailable instead of running something else under its name.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

import asyncpg

from consumerkit import BatchContext, Consumer, HandlerContext, Kafka, Postgres, handler, migrate
from consumerkit.dedup import DedupPolicy, maintain
from consumerkit.dedup.rows import claim_function, lock_timeout_setting
from consumerkit.shared.pooler import Pooler

from .effects import DbEffect, Effect, q
from .peers import FAST_GROUP, Peer, PeerEnv, SetBasedPeer
from .workload import EVENT_TYPE, Amount

BEST: dict[str, Any] = {"max_batch": 500, "max_in_flight": 5000, "concurrency": 4}
"""The best settings the ``sweep`` cell of the full profile found: on 2026-11-22 (2 cores,
20,000 messages, 1,000 keys, 10 % duplicates) these had the highest median, 4,860 msg/s,
against 4,346 with 16 connections, 2,963 with max_batch=100 and 3,014 for the defaults in the
same run. consumerkit's defaults have since become these same settings, so until a new sweep
finds better ones this peer measures the defaults again. Re-run the sweep after engine
changes and update this."""

SWEEP: tuple[dict[str, Any], ...] = (
    {"max_batch": 1},
    {"max_batch": 100, "max_in_flight": 5000},
    {"max_batch": 500, "max_in_flight": 5000},
    {"max_batch": 500, "max_in_flight": 5000, "concurrency": 4},
    {"max_batch": 500, "max_in_flight": 5000, "concurrency": 2},
    {"max_batch": 1000, "max_in_flight": 10000, "concurrency": 4},
)
"""Candidates the ``sweep`` cell measures against each other."""

PREFILL_BATCH = 500
"""Ids per dedup row in :func:`prefill_dedup`: a full poll batch of the default settings."""

Handler = Callable[..., Awaitable[None]]
_PARAMETERS = set(inspect.signature(Consumer).parameters)


def effect_handler(effect: Effect) -> Handler:
    @handler(EVENT_TYPE)
    async def apply_amount(event: Amount, ctx: HandlerContext) -> None:
        await effect.apply(ctx.tx, event.key, event.amount)

    return apply_amount


def deferred_handler(effect: Effect) -> Handler:
    """The same effect queued with ``ctx.defer`` (not awaited): the framework sends the
    queued upserts of a transaction together."""

    @handler(EVENT_TYPE)
    async def apply_amount(event: Amount, ctx: HandlerContext) -> None:
        if not isinstance(effect, DbEffect):  # no database work to defer
            await effect.apply(ctx.tx, event.key, event.amount)
            return
        if effect.delay:
            await asyncio.sleep(effect.delay)
        ctx.defer(effect.sql, event.key, event.amount)

    return apply_amount


def batch_handler(effect: Effect) -> Handler:
    """One call per batch with its fresh events, the effect set-based (one statement), as
    the hand-written set-based peer applies it."""
    @handler(EVENT_TYPE, batch=True)
    async def apply_amounts(events: list[Amount], ctx: BatchContext) -> None:
        await effect.apply_many(ctx.tx, [(e.key, e.amount) for e in events])

    return apply_amounts


def _missing_engine_api(needs: str) -> str | None:
    """Why the installed consumerkit cannot run a peer that ``needs`` ``defer`` or
    ``batch``, else None."""
    if needs == "defer" and not hasattr(HandlerContext, "defer"):
        return "consumerkit.HandlerContext has no defer() yet"
    if needs == "batch" and ("batch" not in inspect.signature(handler).parameters
                             or not hasattr(importlib.import_module("consumerkit"),
                                            "BatchContext")):
        return "consumerkit has no batch handlers (@handler(..., batch=True)) yet"
    return None


def redis_cache_type() -> Any:
    """``consumerkit.dedup.RedisDedupCache``, or None when it is not there."""
    return getattr(importlib.import_module("consumerkit.dedup"), "RedisDedupCache", None)


class ConsumerkitPeer(Peer):
    name = "consumerkit"
    description = ('consumerkit.Consumer with default settings but offsets kept in Kafka '
                   '(offset_store="kafka"), the effect in a handler')
    dedup_table = "processed_events"
    options: ClassVar[Mapping[str, Any]] = {}
    # every peer keeps its offsets in Kafka unless its options say otherwise: the figures
    # stay comparable with consumerkit-before and across runs, and consumerkit-pg-offsets
    # against consumerkit is what the default offset store costs
    base_options: ClassVar[Mapping[str, Any]] = {"offset_store": "kafka"}
    pooler: ClassVar[Pooler] = "none"  # Postgres(pooler=...): what stands before PostgreSQL
    uses_redis: ClassVar[bool] = False
    uses_metrics: ClassVar[bool] = False
    needs: ClassVar[str | None] = None  # "defer" or "batch": an engine API it depends on

    @classmethod
    def make_handler(cls, effect: Effect) -> Handler:
        return effect_handler(effect)

    @classmethod
    def unavailable(cls, redis_url: str | None) -> str | None:
        if cls.needs is not None and (reason := _missing_engine_api(cls.needs)):
            return reason
        missing = sorted(set(cls.options) - _PARAMETERS)
        if missing:
            return f"consumerkit.Consumer has no {', '.join(missing)} argument yet"
        if cls.uses_metrics and "registry" not in _PARAMETERS:
            return "consumerkit.Consumer has no registry argument (metrics) yet"
        if cls.uses_redis:
            if "dedup_cache" not in _PARAMETERS or redis_cache_type() is None:
                return "consumerkit.dedup.RedisDedupCache is not there yet"
            if not redis_url:
                return "no Redis server"
        return None

    def __init__(self, env: PeerEnv) -> None:
        super().__init__(env)
        # a revision without offset_store (consumerkit-before's) keeps them in Kafka anyway
        base = {k: v for k, v in self.base_options.items() if k in _PARAMETERS}
        options = {**base, **self.options}
        if self.uses_redis:
            options["dedup_cache"] = redis_cache_type()(env.redis_url, ttl=timedelta(hours=1))
        if self.uses_metrics:  # a registry of its own: the Prometheus observer is attached
            options["registry"] = importlib.import_module("prometheus_client").CollectorRegistry()
        self.consumer = Consumer(
            name=env.group, handlers=[self.make_handler(env.effect)], topics=[env.topic],
            postgres=Postgres(dsn=env.dsn, schema=env.schema, pooler=self.pooler),
            kafka=Kafka(bootstrap=env.bootstrap, consumer_options=FAST_GROUP),
            handle_signals=False, **options)

    def handled(self) -> int:
        s = self.consumer.stats
        return s.applied + s.duplicates + s.dead_lettered + s.expired_skipped

    def received(self) -> int:
        return self.consumer.stats.delivered

    def ready(self) -> bool:
        return self.consumer.started.is_set() and bool(self.consumer.assignment)

    async def prepare(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        await migrate(conn, self.env.schema, self.consumer.dedup, namespace=self.env.group)

    async def prefill(self, conn: asyncpg.Connection[asyncpg.Record], rows: int) -> None:
        await prefill_window(conn, self.env, self.consumer.dedup, rows)

    async def run(self) -> None:
        task = asyncio.create_task(self.consumer.run())
        stop = asyncio.create_task(self.stop.wait())
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not task.done():
            await self.consumer.stop()
        await task


async def prefill_window(conn: asyncpg.Connection[asyncpg.Record], env: PeerEnv,
                         policy: DedupPolicy, rows: int) -> None:
    """Rows of earlier events spread over the retention window, in their partitions."""
    span = policy.retention - timedelta(hours=1)
    now: datetime = await conn.fetchval("SELECT now()")
    await prefill_dedup(conn, env.schema, policy, env.group, rows, now - span, span)


async def prefill_dedup(conn: asyncpg.Connection[asyncpg.Record], schema: str,
                        policy: DedupPolicy, namespace: str, rows: int, start: datetime,
                        span: timedelta) -> None:
    """``rows`` dedup ids of other events with ``seen_at`` spread evenly over
    ``(start, start + span)``, after creating the partitions that range needs. The ids are
    stored as a consumer stores them: one row per claim of ``PREFILL_BATCH`` ids."""
    moment = start
    while moment <= start + span:
        await maintain(conn, schema, policy, now=moment)
        moment += policy.partition_interval
    table = f"{q(schema)}.{policy.table}"
    name_key = f"{q(schema)}.consumerkit_name_key"
    await conn.execute(
        f"INSERT INTO {table} (seen_at, namespace_key, handler_key, texts) "
        "SELECT $2::timestamptz + $3::interval * ((b + 0.5) / ceil($4::numeric / $5)), "
        f"{name_key}($1), {name_key}('apply_amount'), "
        "ARRAY(SELECT 'old-' || g FROM generate_series(b * $5 + 1, least((b + 1) * $5, $4)) g) "
        "FROM generate_series(0, ceil($4::numeric / $5)::int - 1) AS b",
        namespace, start, span, rows, PREFILL_BATCH)
    await conn.execute(f"ANALYZE {table}")


def variant(options: Mapping[str, Any], name: str | None = None) -> type[ConsumerkitPeer]:
    """A consumerkit peer with ``options`` passed to ``Consumer``."""
    label = name or "consumerkit[" + ",".join(f"{k}={v}" for k, v in options.items()) + "]"
    return type(f"Consumerkit_{abs(hash(label))}", (ConsumerkitPeer,), {
        "name": label, "options": dict(options),
        "description": "consumerkit.Consumer with " + ", ".join(
            f"{k}={v}" for k, v in options.items())})


class ConsumerkitRedisPeer(ConsumerkitPeer):
    name = "consumerkit-redis"
    description = ("consumerkit defaults with RedisDedupCache (ttl 1 h) in front of the "
                   "PostgreSQL dedup table")
    uses_redis = True


class ConsumerkitBestPeer(ConsumerkitPeer):
    name = "consumerkit-best"
    description = "consumerkit with " + ", ".join(f"{k}={v}" for k, v in BEST.items())
    options = BEST


class ConsumerkitMetricsPeer(ConsumerkitPeer):
    name = "consumerkit-metrics"
    description = ("consumerkit defaults with Prometheus metrics kept (a registry given, so the "
                   "metrics observer counts every outcome)")
    uses_metrics = True


class ConsumerkitPostgresOffsetsPeer(ConsumerkitPeer):
    name = "consumerkit-pg-offsets"
    description = ('consumerkit defaults (offset_store="postgres"): each partition\'s next '
                   "offset upserted in the effects' transaction")
    options: ClassVar[Mapping[str, Any]] = {"offset_store": "postgres"}


class ConsumerkitDeferPeer(ConsumerkitPeer):
    name = "consumerkit-defer"
    description = ("consumerkit defaults, a per-message handler queuing its upsert with "
                   "ctx.defer(...) (not awaited)")
    needs = "defer"

    @classmethod
    def make_handler(cls, effect: Effect) -> Handler:
        return deferred_handler(effect)


class ConsumerkitBatchPeer(ConsumerkitPeer):
    name = "consumerkit-batch"
    description = ("consumerkit defaults, a batch handler (@handler(..., batch=True)) applying "
                   "its fresh events with one set-based upsert")
    needs = "batch"

    @classmethod
    def make_handler(cls, effect: Effect) -> Handler:
        return batch_handler(effect)


class SetBasedClaimPeer(SetBasedPeer):
    """The hand-written set-based loop with consumerkit's dedup table in place of its plain
    one: the same loop, the same effect, one ``{table}_claim_many`` call per poll batch. Set
    beside ``set-based`` and ``consumerkit-batch``, it splits the batch handler's gap in two:
    what the dedup table costs (time partitions, no unique key across them, so a lock and a
    lookup per id) and what the engine costs around it."""

    name = "set-based-claim"
    description = ("the set-based loop, its dedup one call of consumerkit's claim function "
                   "over consumerkit's dedup table (defaults) per poll batch")
    policy: ClassVar[DedupPolicy] = DedupPolicy()  # frozen: safe to share
    dedup_table = policy.table

    async def prepare(self, conn: asyncpg.Connection[asyncpg.Record]) -> None:
        await migrate(conn, self.env.schema, self.policy, namespace=self.env.group)

    async def prefill(self, conn: asyncpg.Connection[asyncpg.Record], rows: int) -> None:
        await prefill_window(conn, self.env, self.policy, rows)

    async def open(self) -> None:
        await super().open()
        # the statement PostgresDedupStore sends for a batch of one handler, with no event
        # times (all young, as the store leaves them out) and no diagnostics: $3 to $5 are
        # claim_args
        self.claim_sql = (
            f"SELECT ord, status FROM "
            f"{claim_function(self.env.schema, self.policy.table, 'claim_many')}($1, $2, "
            "NULL, $3, array_fill($4::text, ARRAY[cardinality($2::text[])]), NULL, NULL, "
            "NULL, NULL, NULL, $5)")
        self.claim_args = (self.policy.retention, "apply_amount",
                           lock_timeout_setting(self.policy.claim_lock_timeout))

    async def claim_many(self, event_ids: list[str], records: list[Any]) -> set[str]:
        rows = await self.conn.fetch(self.claim_sql, self.env.group, event_ids,
                                     *self.claim_args)
        # "claimed" marks an id's first occurrence in the batch only, as the loop expects
        return {event_id for event_id, row in zip(event_ids, rows, strict=True)
                if row["status"] == "claimed"}
