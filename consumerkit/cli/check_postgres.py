"""``consumerkit check``'s PostgreSQL: reachable, ``synchronous_commit`` on, every table
migrated, dedup partitions created ahead, and a warning for each asynchronous standby."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..dedup.layout import existing_layout
from ..dedup.partitions import list_partitions
from ..errors import ConsumerKitError
from ..offsets.postgres import TABLE as OFFSETS
from ..schema import VERSION_TABLE, behind
from .check_deployment import Deployment, Report
from .errors import MIGRATE_HINT, database


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
