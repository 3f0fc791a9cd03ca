"""``consumerkit migrate``: create every table any command touches, and say what it did.

The dead-letter table and the retention registry (component ``core``), the dedup table and its
claim functions (``dedup:<table>``, then its partitions ahead), the parked keys' tables
(``parking``), and each outbox with its failure and idempotency-key side tables
(``outbox:<table>``); with ``--outbox-only``, the outboxes alone (a service that writes an
outbox and consumes nothing); with ``--outbox-cdc``, each outbox's publication and replication
slot for a connector, made before any event. All through :func:`consumerkit.migrate`.
Idempotent: a second run finds everything already present.
"""

from __future__ import annotations

import argparse
import sys

from ..dedup.policy import DedupPolicy
from ..grants import runtime_grants
from ..migration import migrate
from ..outbox.cdc import prepare_cdc
from ..outbox.cli import cdc_line
from ..outbox.retention import OutboxRetention
from ..outbox.table import OutboxTable
from ..schema import applied_versions
from .admin import dsn
from .common import database_args, duration, policy_args, sub
from .errors import CommandError, database

WHAT = {"core": "dead-letter table, retention registry and consumer offsets",
        "dedup": "dedup table",
        "outbox": "outbox and its side tables",
        "parking": "parked keys, their records and audit"}


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = database_args(sub(
        commands, "migrate", "create or upgrade every table consumerkit uses",
        "Create or upgrade, idempotently, every table the commands and consumers use: dead "
        "letters, the dedup table and its partitions ahead, and the outbox with its side "
        "tables. Prints what it created and what was already present."))
    policy_args(parser)
    parser.add_argument("--layout", choices=["partitioned", "table"], default="partitioned",
                        help="the dedup table's layout (when it is created)")
    parser.add_argument("--diagnostics", action="store_true",
                        help="keep the dedup rows' diagnostic columns when converting an "
                        "existing table to lean rows (DedupPolicy(diagnostics=True))")
    parser.add_argument("--outbox-table", dest="outbox_tables", action="append",
                        metavar="TABLE", help="an outbox table (repeat for several; "
                        "default: outbox)")
    parser.add_argument("--outbox-retention", type=duration, metavar="DURATION",
                        help="create the outbox tables kept this long in time partitions, "
                        "for change data capture (OutboxRetention; partitions one day wide)")
    parser.add_argument("--outbox-only", action="store_true",
                        help="create or upgrade the outboxes alone, no dedup or dead-letter "
                        "table (a service that writes an outbox and consumes nothing)")
    parser.add_argument("--outbox-cdc", action="store_true",
                        help="the outbox is read by a connector (Debezium): also create its "
                        "publication and replication slot, before any event")
    parser.add_argument("--print-grants", metavar="ROLE",
                        help="then print the GRANTs a runtime role needs (docs/security.md)")
    parser.set_defaults(handler=migrate_command)


def describe(component: str, before: int | None, after: int | None) -> str:
    kind, _, name = component.partition(":")
    what = f"{WHAT.get(kind, kind)}{' ' + name if name else ''}"
    if before is None:
        return f"created {what} (version {after})"
    if after != before:
        return f"upgraded {what} from version {before} to {after}"
    return f"{what}: already present (version {after})"


# the dedup table's flags, by the DedupPolicy field each one sets
DEDUP_FLAGS = {"table": "--table", "retention": "--retention",
               "partition_interval": "--interval", "layout": "--layout",
               "diagnostics": "--diagnostics"}


async def migrate_command(args: argparse.Namespace) -> int:
    policy = DedupPolicy(retention=args.retention, partition_interval=args.interval,
                         table=args.table, layout=args.layout, diagnostics=args.diagnostics)
    if args.outbox_only:  # a flag that would do nothing is a mistake to say, not to ignore
        given = [flag for name, flag in DEDUP_FLAGS.items()
                 if getattr(policy, name) != getattr(DedupPolicy(), name)]
        if given:
            raise CommandError(f"--outbox-only migrates no dedup table: {', '.join(given)} "
                               "would do nothing; drop it, or migrate without --outbox-only")
    retention = None if args.outbox_retention is None else OutboxRetention(
        args.outbox_retention)
    outboxes = [OutboxTable(args.schema, t, retention)
                for t in args.outbox_tables or ["outbox"]]
    async with database(dsn(args)) as conn:
        before = await applied_versions(conn, args.schema)
        await migrate(conn, args.schema, None if args.outbox_only else policy,
                      outboxes=outboxes)
        cdc = [cdc_line(await prepare_cdc(conn, table))
               for table in outboxes if args.outbox_cdc]
        after = await applied_versions(conn, args.schema)
        grants = (await runtime_grants(conn, args.schema, args.print_grants)
                  if args.print_grants else [])
    # with --print-grants the statements alone go to stdout, so they can be piped to psql
    report = sys.stderr if args.print_grants else sys.stdout
    schema_wide = [] if args.outbox_only else ["core", f"dedup:{policy.table}", "parking"]
    wanted = [*schema_wide, *(f"outbox:{t.table}" for t in outboxes)]
    # an outbox kept for a retention brings the core steps (partition functions) along
    wanted += sorted(c for c in after if c not in wanted and after[c] != before.get(c))
    for component in wanted:
        print(describe(component, before.get(component), after.get(component)), file=report)
    for line in cdc:
        print(line, file=report)
    print(f"outboxes of schema {args.schema} are up to date" if args.outbox_only
          else f"schema {args.schema} is up to date", file=report)
    if grants:
        print("\n".join(grants))
    return 0
