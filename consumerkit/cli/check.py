"""``consumerkit check [MODULE:ATTR]``: what is wrong with a deployment, one line each.

PostgreSQL (:mod:`.check_postgres`): reachable, ``synchronous_commit`` on, every table
migrated, dedup partitions created at least one interval ahead, no replication slot inactive or
keeping more WAL than ``--max-slot-wal``, a slot reading each outbox a connector reads; a
warning for each asynchronous standby (a failover to it can lose acknowledged commits). The
broker (:mod:`.check_broker`): reachable, every topic present, no topic keeping records longer
than the dedup window, every consumed or published topic replicated (replication factor,
``min.insync.replicas``, no unclean leader election: a ``WARNING``, which leaves the exit status
0, since a development cluster may have one broker), and with published topics the relay's
idempotent producer fitting the broker. With ``MODULE:ATTR`` the consumer's own schema, dedup
policy, topics, retries and outbox are checked, and the event types of its topics' recent
records against its handlers (see :mod:`.check_sample`). With ``--handlers MODULE:ATTR`` the
parked records, dead letters and unpublished outbox rows are decoded by that consumer's
handlers (see :mod:`.check_handlers`).
Exit status 1 when anything is wrong, else 0 and a short all-clear (warnings do not change it).
"""

from __future__ import annotations

import argparse

from ..errors import ConsumerKitError
from ..settings import ConsumerSettings
from . import check_sample, check_slots
from .check_broker import check_broker
from .check_connections import add_arguments as add_connections_arguments
from .check_connections import check_connections
from .check_deployment import Report, described
from .check_handlers import add_arguments as add_handlers_arguments
from .check_handlers import check_handlers, validate_handlers_arguments
from .check_kafka import (
    WANTED_REPLICATION,
)
from .check_locks import check_locks
from .check_pooler import check_pooler
from .check_postgres import check_postgres
from .common import REPLICATION_MAX, policy_args, sub, whole
from .errors import one_line
from .options import add_settings_arguments, load_settings

SERVICE_FIELDS = {"postgres.dsn", "postgres.schema", "postgres.pooler", "kafka.bootstrap",
                  "kafka.security_protocol", "kafka.sasl_mechanism", "kafka.sasl_plain_username",
                  "kafka.sasl_plain_password", "kafka.ssl_cafile", "kafka.ssl_certfile",
                  "kafka.ssl_keyfile", "kafka.ssl_password"}
# what the sample's unhandled types would become
TYPE_FIELDS = {"unhandled.policy", "unhandled.ignore"}


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


async def check_command(args: argparse.Namespace) -> int:
    validate_handlers_arguments(args)
    settings = load_settings(args, ConsumerSettings)
    deployment = await described(args, settings)
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

