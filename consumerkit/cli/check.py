"""``consumerkit check [MODULE:ATTR]``: what is wrong with a deployment, one line each.

PostgreSQL: reachable, ``synchronous_commit`` on, every table migrated, dedup partitions
created at least one interval ahead, no replication slot inactive or keeping more WAL than
``--max-slot-wal``, a slot reading each outbox a connector reads; a warning for each
asynchronous standby (a failover to it can lose acknowledged commits). The broker: reachable,
every topic present, no topic keeping records longer than the dedup window, every consumed or
published topic replicated (replication factor, ``min.insync.replicas``, no unclean leader
election: a ``WARNING``, which leaves the exit status 0, since a development cluster may have
one broker), and with published topics the relay's idempotent producer fitting the broker. With
``MODULE:ATTR`` the consumer's own schema, dedup policy, topics, retries and outbox are
checked, and the event types of its topics' recent records against its handlers (see
:mod:`.check_sample`). With ``--handlers MODULE:ATTR`` the parked records, dead letters and
unpublished outbox rows are decoded by that consumer's handlers (see :mod:`.check_handlers`).
Exit status 1 when anything is wrong, else 0 and a short all-clear (warnings do not change it).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..dedup.horizon import Finding, redelivery_horizon_check
from ..dedup.layout import existing_layout
from ..dedup.partitions import list_partitions
from ..dedup.policy import DedupPolicy
from ..errors import ConsumerKitError
from ..offsets.postgres import TABLE as OFFSETS
from ..outbox.table import OutboxTable
from ..retry import RetryPolicy
from ..schema import VERSION_TABLE, behind
from ..settings import CommonSettings, ConsumerSettings, RelaySettings
from ..shared.pooler import Pooler
from ..transport.kafka import KafkaProducer
from ..transport.kafka_access import hidden_topics, principal
from . import check_sample, check_slots
from .check_connections import add_arguments as add_connections_arguments
from .check_connections import check_connections
from .check_handlers import add_arguments as add_handlers_arguments
from .check_handlers import check_handlers, validate_handlers_arguments
from .check_kafka import (
    WANTED_REPLICATION,
    durability_findings,
    idempotence_finding,
    topic_durability,
)
from .check_locks import check_locks
from .check_pooler import check_pooler
from .common import REPLICATION_MAX, policy_args, sub, whole
from .errors import MIGRATE_HINT, database, one_line
from .options import add_settings_arguments, load_settings, sources
from .run import apply_settings
from .target import load_consumer

SERVICE_FIELDS = {"postgres_dsn", "kafka_bootstrap", "db_schema", "security_protocol",
                  "sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "ssl_cafile",
                  "ssl_certfile", "ssl_keyfile", "ssl_password", "postgres_pooler"}
TYPE_FIELDS = {"unhandled", "ignore"}  # what the sample's unhandled types would become


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub(commands, "check", "report what is wrong with a deployment", __doc__)
    parser.add_argument("target", metavar="MODULE:ATTR", nargs="?", default=None,
                        help="check this consumer's schema, dedup policy, topics and outbox "
                        "(default: the options below)")
    add_settings_arguments(parser, ConsumerSettings, only=SERVICE_FIELDS | TYPE_FIELDS)
    policy_args(parser)
    parser.add_argument("--expired", choices=["dead_letter", "skip", "apply"],
                        default="dead_letter", help="the consumers' expired policy")
    parser.add_argument("--topic", dest="topics", action="append", default=None,
                        help="a topic the consumers read (repeat for several; default: none)")
    parser.add_argument("--outbox-table", dest="outbox_tables", action="append", default=None,
                        metavar="TABLE", help="an outbox table to look for (repeat; "
                        "default: none)")
    parser.add_argument("--published-topic", dest="published", action="append", default=None,
                        metavar="TOPIC", help="a topic the relay publishes to (repeat; "
                        "default: none); with one, the relay's idempotence is checked too")
    parser.add_argument("--enable-idempotence", dest="enable_idempotence",
                        action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                        help="the relay's idempotent producer (default: on; "
                        "$CONSUMERKIT_ENABLE_IDEMPOTENCE)")
    parser.add_argument("--min-replication", type=whole(1, REPLICATION_MAX),
                        default=WANTED_REPLICATION,
                        help="the replication factor every topic must have at least "
                        "(1 for a one-broker development cluster)")
    add_handlers_arguments(parser)
    check_slots.add_arguments(parser)
    check_sample.add_arguments(parser)
    add_connections_arguments(parser)
    parser.set_defaults(handler=check_command)


@dataclass
class Deployment:
    """What to check, from the options or a consumer. Its repr leaves out the DSN and the
    Kafka options (they hold passwords)."""

    dsn: str | None = field(repr=False)
    bootstrap: str | None
    schema: str
    policy: DedupPolicy
    topics: list[str]
    outboxes: list[OutboxTable]
    kafka_options: Mapping[str, Any] = field(repr=False)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    handler_timeout: float | None = 60.0
    published: list[str] = field(default_factory=list)
    idempotence: bool = True  # the relay's
    replication: int = WANTED_REPLICATION
    offset_store: str = "postgres"  # "postgres" needs the offsets table
    pooler: Pooler = "none"  # what the deployment says stands in front of PostgreSQL
    concurrency: int = 4  # the consumers' (a Consumer's default with batches)
    consumer: Any = field(default=None, repr=False)  # the Consumer of MODULE:ATTR, if given
    # the outboxes a connector reads (Debezium): each needs a replication slot reading it
    cdc_outboxes: list[OutboxTable] = field(default_factory=list)


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def ok(self, text: str) -> None:
        print(f"ok       {text}")

    def note(self, text: str) -> None:
        print(f"note     {text}")

    def warn(self, text: str) -> None:
        """A risk the deployment may have chosen: said, but not a failed check."""
        print(f"WARNING  {text}")
        self.warnings.append(text)

    def problem(self, text: str) -> None:
        print(f"PROBLEM  {text}")
        self.problems.append(text)


async def check_command(args: argparse.Namespace) -> int:
    validate_handlers_arguments(args)
    settings = load_settings(args, ConsumerSettings)
    deployment = await _deployment(args, settings)
    report = Report()
    await check_postgres(deployment, report)
    if deployment.dsn:
        await check_pooler(deployment.dsn, deployment.pooler, report)
    await check_connections(deployment.dsn, args, deployment.concurrency, deployment.pooler,
                            report)
    await check_locks(deployment.dsn, args, deployment.schema, deployment.policy,
                      deployment.concurrency, report)
    await check_slots.check_slots(deployment.dsn, args.max_slot_wal, report)
    await check_slots.check_cdc_outboxes(deployment.dsn, deployment.cdc_outboxes, report)
    await check_broker(deployment, report)
    if deployment.consumer is not None:  # its topics' event types against its handlers
        await check_sample.check_sample(deployment.consumer, args.sample,
                                        args.sample_timeout, report)
    if args.handlers is not None:  # the events waiting in the database, decoded by new code
        try:
            await check_handlers(args, deployment.dsn, report)
        except ConsumerKitError as exc:
            report.problem(one_line(exc) or str(exc))
    if report.problems:
        print(f"{len(report.problems)} problem{'s' if len(report.problems) > 1 else ''} found")
        return 1
    warned = len(report.warnings)
    print(f"all clear ({warned} warning{'s' if warned > 1 else ''})" if warned else "all clear")
    return 0


async def _deployment(args: argparse.Namespace, settings: CommonSettings) -> Deployment:
    deployment = await _described(args, settings)
    deployment.published = args.published or []
    relay = load_settings(args, RelaySettings)
    assert isinstance(relay, RelaySettings)
    deployment.idempotence = relay.enable_idempotence
    deployment.replication = args.min_replication
    return deployment


async def _described(args: argparse.Namespace, settings: CommonSettings) -> Deployment:
    if args.target is None:
        outboxes = [OutboxTable(settings.db_schema, t) for t in args.outbox_tables or []]
        return Deployment(
            dsn=settings.dsn(), bootstrap=settings.kafka_bootstrap, schema=settings.db_schema,
            policy=DedupPolicy(retention=args.retention, partition_interval=args.interval,
                               table=args.table, expired=args.expired),
            topics=args.topics or [],
            outboxes=outboxes, cdc_outboxes=outboxes if args.outbox_cdc else [],
            kafka_options=settings.kafka_options(),
            offset_store=getattr(settings, "offset_store", "postgres"),
            pooler=settings.postgres_pooler,
            concurrency=getattr(settings, "concurrency", None) or 4)
    assert isinstance(settings, ConsumerSettings)
    consumer = await load_consumer(args.target)
    apply_settings(consumer, settings, sources(args, ConsumerSettings))
    return Deployment(
        dsn=consumer.postgres_dsn, bootstrap=consumer.kafka_bootstrap, schema=consumer.schema,
        policy=consumer.dedup, topics=[*consumer.topics, *(args.topics or [])],
        outboxes=[consumer.outbox.table] if consumer.outbox is not None else [],
        cdc_outboxes=[consumer.outbox.table] if consumer.outbox is not None and (
            consumer.outbox.delete_after_insert or consumer.outbox.table.retention) else [],
        kafka_options=consumer.kafka_options, retry=consumer.retry,
        handler_timeout=consumer.handler_timeout, offset_store=consumer.offset_store,
        pooler=consumer.postgres_pooler, concurrency=consumer.concurrency,
        consumer=consumer)


async def check_postgres(d: Deployment, report: Report) -> None:
    try:
        async with database(d.dsn) as conn:
            report.ok(f"PostgreSQL answers ({await conn.fetchval('SHOW server_version')})")
            if await conn.fetchval("SELECT current_setting('synchronous_commit')") == "off":
                report.problem("synchronous_commit is off: a committed effect can vanish in a "
                               "crash after its offset was committed; turn it on for this role")
            await _standbys(conn, report)
            tables = [VERSION_TABLE, "dead_letters", *(t.table for t in d.outboxes),
                      *(f"{t.table}_failures" for t in d.outboxes),
                      *([OFFSETS] if d.offset_store == "postgres" else [])]
            missing = [t for t in tables if await conn.fetchval(
                "SELECT to_regclass($1)", f"{d.schema}.{t}") is None]
            layout = await existing_layout(conn, d.schema, d.policy.table)
            if layout is None:
                missing.append(d.policy.table)
            if missing:
                report.problem(f"tables missing in schema {d.schema}: {', '.join(missing)}; "
                               f"{MIGRATE_HINT.replace(' it', ' them')}")
            else:
                report.ok(f"tables of schema {d.schema} present")
            if lagging := await behind(conn, d.schema, d.policy):
                report.problem(f"schema {d.schema} is older than this consumerkit "
                               f"({', '.join(lagging)}): run `consumerkit migrate` as its "
                               "owner (with the same --postgres and --schema) to upgrade it")
            if layout == "partitioned":
                await _partitions_ahead(conn, d, report)
    except ConsumerKitError as exc:
        report.problem(str(exc))


# physical standbys only: a logical walsender (Debezium, say) holds a logical slot
_STANDBYS = """
SELECT r.application_name, r.sync_state FROM pg_stat_replication r
WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots s
                  WHERE s.active_pid = r.pid AND s.slot_type = 'logical')
ORDER BY r.application_name"""


async def _standbys(conn: Any, report: Report) -> None:
    """Warn of asynchronous standbys: promoted, one can lack commits already acknowledged
    (docs/failover.md)."""
    standbys = await conn.fetch(_STANDBYS)
    if not standbys:
        return
    if any(r["sync_state"] is None for r in standbys):
        report.note(f"{len(standbys)} standby(s) stream from this server, but this role cannot "
                    "see whether they are synchronous (grant it pg_monitor)")
        return
    names = await conn.fetchval("SELECT current_setting('synchronous_standby_names')")
    lagging = [r["application_name"] or "(unnamed)" for r in standbys
               if r["sync_state"] in ("async", "potential")]
    if lagging:
        empty = " (synchronous_standby_names is empty)" if not names.strip() else ""
        report.warn(f"asynchronous standby: {', '.join(lagging)}{empty}; a failover to it "
                    "can lose commits already acknowledged (effects, dedup rows, outbox rows) "
                    "and leave published events without their source; see "
                    "synchronous_standby_names in docs/failover.md")
    else:
        report.ok(f"standbys synchronous: "
                  f"{', '.join(r['application_name'] for r in standbys)}")


async def _partitions_ahead(conn: Any, d: Deployment, report: Report) -> None:
    parts = await list_partitions(conn, d.schema, d.policy.table)
    now: datetime = await conn.fetchval("SELECT now()")
    newest = max((p.upper for p in parts if p.upper is not None), default=None)
    if newest is None or newest - now < d.policy.partition_interval:
        ends = "no partition at all" if newest is None else f"the newest ends at {newest}"
        report.problem(f"dedup partitions of {d.schema}.{d.policy.table} not created ahead "
                       f"({ends}): run `consumerkit dedup maintain` and keep a consumer "
                       "running (it maintains them)")
    else:
        report.ok(f"dedup partitions ready until {newest:%Y-%m-%d %H:%M %Z}")


async def check_broker(d: Deployment, report: Report) -> None:
    if d.bootstrap is None:
        if d.topics:
            report.problem("topics given but no broker: pass --kafka or set "
                           "CONSUMERKIT_KAFKA_BOOTSTRAP")
        else:
            report.note("broker not checked: pass --kafka or set CONSUMERKIT_KAFKA_BOOTSTRAP")
        return
    known = await broker_topics(d.bootstrap, d.kafka_options, report)
    if known is None:
        return
    wanted = list(dict.fromkeys([*d.topics, *d.published]))
    missing = sorted(set(wanted) - known)
    hidden = await hidden_topics(d.bootstrap, missing, d.kafka_options) if missing else []
    if hidden:  # the topic list leaves out what the principal may not describe
        report.problem(f"topics denied to {principal(d.kafka_options)}: {', '.join(hidden)} "
                       "(TOPIC_AUTHORIZATION_FAILED, which a broker also answers for a topic "
                       "it has not, to whoever may not describe it): it needs an ACL allowing "
                       "READ on each it consumes, WRITE on each it publishes to")
    if absent := [t for t in missing if t not in hidden]:
        report.problem(f"topics missing on the broker: {', '.join(absent)}")
    # durability: a "warning" may be deliberate (a development cluster), an "error" is not
    durability: list[Finding] = []
    relay = await idempotence_finding(d.bootstrap, d.kafka_options, d.idempotence) if (
        d.published) else None
    durability += [relay] if relay is not None else []
    present = [t for t in wanted if t in known]
    if present:
        report.ok(f"topics present: {', '.join(present)}")
        durability += durability_findings(
            await topic_durability(d.bootstrap, present, d.kafka_options),
            replication=d.replication)
    for finding in durability:
        {"unknown": report.note, "warning": report.warn}.get(
            finding.level, report.problem)(finding.message)
    consumed = [t for t in d.topics if t in known]
    if consumed:
        for finding in await redelivery_horizon_check(
                d.policy, topics=consumed, kafka_bootstrap=d.bootstrap, retry=d.retry,
                handler_timeout=d.handler_timeout, kafka_options=d.kafka_options):
            (report.note if finding.level == "unknown" else report.problem)(finding.message)


async def broker_topics(bootstrap: str, options: Mapping[str, Any],
                        report: Report) -> set[str] | None:
    """The broker's topics, or None (and a problem) when it cannot be reached."""
    try:
        topics = await reach_broker(bootstrap, options)
    except ConsumerKitError as exc:
        report.problem(one_line(exc) or str(exc))
        return None
    report.ok(f"Kafka broker at {bootstrap} answers")
    return topics


async def reach_broker(bootstrap: str, options: Mapping[str, Any]) -> set[str]:
    """The broker's topics; :class:`StartupError` when it cannot be reached."""
    producer = KafkaProducer(bootstrap, {**options, "enable_idempotence": False})
    try:
        await producer.start()
        return await producer.topics()
    finally:
        await producer.stop()


