"""``consumerkit check --processes N --relays N``: the PostgreSQL connections a deployment
needs, counted against what the server allows.

Each consumer process opens a pool of ``concurrency + 2`` (its transactions, the offsets'
recheck, maintenance) and one connection for readiness probes; each relay one for its
slots, one for its batches and one for probes; a command such as this one, one. The sum must
fit in ``max_connections`` less ``superuser_reserved_connections`` and the connections
other clients hold now. Behind a pooler the sum is what the pooler's clients need; the
pooler's own pool is what reaches PostgreSQL.
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol

import asyncpg

from ..shared.pooler import Pooler
from .common import count
from .errors import database

PER_RELAY = 3  # slots (or leases), batches, readiness probe
COMMAND = 1


class Findings(Protocol):
    def ok(self, text: str) -> None: ...
    def note(self, text: str) -> None: ...
    def problem(self, text: str) -> None: ...


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--processes", type=count, default=None, metavar="N",
                        help="consumer processes of the deployment: count the PostgreSQL "
                        "connections and lock-table entries it needs against the server's "
                        "(default: not counted)")
    parser.add_argument("--relays", type=count, default=0, metavar="N",
                        help="with --processes: relay processes of the deployment")


def needed(processes: int, concurrency: int, relays: int) -> int:
    """Connections of ``processes`` consumers at ``concurrency``, ``relays`` relays and one
    command."""
    return processes * (concurrency + 3) + relays * PER_RELAY + COMMAND


async def check_connections(dsn: str | None, args: argparse.Namespace, concurrency: int,
                            pooler: Pooler, report: Findings) -> None:
    if args.processes is None:
        return
    want = needed(args.processes, concurrency, args.relays)
    formula = (f"{args.processes} consumer process(es) x (limits.concurrency {concurrency} + 3) "
               f"+ {args.relays} relay(s) x {PER_RELAY} + {COMMAND} command = {want}")
    try:
        async with database(dsn) as conn:
            limits: Any = await conn.fetchrow(
                "SELECT current_setting('max_connections')::int AS most, "
                "current_setting('superuser_reserved_connections')::int AS reserved, "
                "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
                "AND pid <> pg_backend_pid()) AS others")
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return  # PostgreSQL's own check says why
    room = limits["most"] - limits["reserved"] - limits["others"]
    where = (f"max_connections {limits['most']} - {limits['reserved']} reserved - "
             f"{limits['others']} in use = {room}")
    if pooler == "transaction":
        report.note(f"connections the deployment opens to the pooler: {formula}; PostgreSQL "
                    f"has room for {room} ({where}): the pooler's pool must fit in it")
    elif want > room:
        report.problem(f"connections needed: {formula}, more than PostgreSQL has room for "
                       f"({where}): raise max_connections, lower limits.concurrency, or put "
                       "a pooler in transaction mode in front "
                       "(CONSUMERKIT_POSTGRES_POOLER=transaction, --postgres-pooler "
                       'transaction, Postgres(pooler="transaction"))')
    else:
        report.ok(f"connections needed: {formula}, within {where}")
