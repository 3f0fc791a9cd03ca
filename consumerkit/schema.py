"""Creating and upgrading consumerkit's tables: idempotent, and safe when processes race.

Every consumer process may migrate at start-up (:func:`consumerkit.migrate`, which calls
:func:`migrate_schema`). One transaction holds an advisory lock derived from the schema name,
so concurrent migrations of one schema run one after the other and each later one finds the
work done. DDL in PostgreSQL is transactional: a failed
migration leaves nothing half-built.

A step that replaces the claim function while transactions may hold the old one's locks runs
in a second transaction, once the transactions older than the first one's commit have ended
(:attr:`Step.after_older_transactions`, :mod:`consumerkit.dedup.guard`).

``{schema}.consumerkit_schema_version`` records the steps applied, per component: ``core``
(schema-wide objects such as the dead-letter table) and ``dedup:<table>`` (one per dedup table,
since a policy may name its own table). An upgrade appends a step to a component's list; a
step, once recorded, never runs again. Each dedup layout has its own list of steps
(:data:`DEDUP_STEPS`, :data:`TABLE_DEDUP_STEPS`); the catalog says which layout a table has,
and a policy asking for the other one is refused before anything runs. A new dedup table runs
every step too: it is created in the first layout (one row per id) and converted to lean rows
by the last step, so every migration exercises the conversion an existing table goes through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from .deadletter.store import resolution_ddl
from .deadletter.table import dead_letter_ddl
from .dedup.ddl_functions import ddl_functions_ddl, record_interval
from .dedup.guard import guard_ddl, wait_for_older_transactions
from .dedup.layout import check_layout
from .dedup.legacy import claim_ddl, claim_many_ddl, dedup_ddl, table_dedup_ddl
from .dedup.names import names_ddl
from .dedup.partitions import LOCK_SEED, maintain
from .dedup.policy import DedupPolicy
from .dedup.postgres import DEFAULT_POLICY
from .dedup.retention import register, retention_ddl
from .dedup.rows import check_dedup_names
from .dedup.rows import claim_many_ddl as lean_claim_many_ddl
from .dedup.upgrade import lean_rows_ddl
from .errors import StartupError
from .offsets.postgres import offsets_ddl
from .parking.tables import COMPONENT as PARKING
from .parking.tables import STEPS as PARKING_STEPS
from .parking.tables import migrate_parking
from .shared.identifiers import identifier, qualified
from .types import DbConnection

VERSION_TABLE = "consumerkit_schema_version"

log = logging.getLogger("consumerkit.schema")


@dataclass(frozen=True, slots=True)
class Step:
    """One migration step: its version within a component, and the statements it runs."""

    version: int
    description: str
    statements: Callable[[str, DedupPolicy], list[str]]
    after_older_transactions: bool = False
    """Run in a transaction of its own, once every transaction that was running when the
    steps before it committed has ended (a claim function replaced while transactions may
    still hold the old one's locks: :mod:`consumerkit.dedup.guard`)."""


def _lean_claim(schema: str, policy: DedupPolicy) -> list[str]:
    return [lean_claim_many_ddl(schema, policy, "advisory")]


def _guarded_claim(schema: str, policy: DedupPolicy) -> list[str]:
    return [*guard_ddl(schema, policy.table),
            lean_claim_many_ddl(schema, policy, "guard and advisory")]


def _guard_only_claim(schema: str, policy: DedupPolicy) -> list[str]:
    return [lean_claim_many_ddl(schema, policy, "guard")]


_GUARDED = "bulk claim waiting on a guard table's unique index and on the advisory locks"
_GUARD_ONLY = "bulk claim waiting on the guard alone, no lock-table entry per id"


CORE_STEPS = (
    Step(1, "dead-letter table", lambda schema, _policy: dead_letter_ddl(schema)),
    Step(2, "dedup retention registry", lambda schema, _policy: retention_ddl(schema)),
    Step(3, "partition maintenance functions for a role without DDL rights",
         lambda schema, _policy: ddl_functions_ddl(schema)),
    Step(4, "partition bounds checked against the recorded partition interval",
         lambda schema, _policy: ddl_functions_ddl(schema)),
    Step(5, "names of namespaces and handlers as small keys",
         lambda schema, _policy: names_ddl(schema)),
    Step(6, "consumer offsets stored with the effects (offset_store=\"postgres\")",
         lambda schema, _policy: offsets_ddl(schema)),
    Step(7, "partition maintenance functions for outboxes kept for a retention",
         lambda schema, _policy: ddl_functions_ddl(schema)),
    Step(8, "name keys registered by racing transactions never read as a collision",
         lambda schema, _policy: names_ddl(schema)),
    Step(9, "dead letters replayed or discarded: status, who, when, the last replay's error",
         lambda schema, _policy: resolution_ddl(schema)),
)
DEDUP_STEPS = (
    Step(1, "partitioned dedup table and claim function", dedup_ddl),
    Step(2, "claim function with a bounded lock wait", claim_ddl),
    Step(3, "bulk claim function", claim_many_ddl),
    Step(4, "lean rows: ids packed per claim, UUIDs in 16 bytes, names as keys", lean_rows_ddl),
    Step(5, "bulk claim taking its locks in one statement", _lean_claim),
    Step(6, "bulk claim telling UUIDs by a cast, not a pattern", _lean_claim),
    Step(7, _GUARDED, _guarded_claim),
    Step(8, _GUARD_ONLY, _guard_only_claim, after_older_transactions=True),
)
TABLE_DEDUP_STEPS = (
    Step(1, "plain dedup table with a unique key and its bulk claim function", table_dedup_ddl),
    Step(2, "lean rows: ids packed per claim, UUIDs in 16 bytes, names as keys", lean_rows_ddl),
    Step(3, "bulk claim taking its locks in one statement", _lean_claim),
    Step(4, "bulk claim telling UUIDs by a cast, not a pattern", _lean_claim),
    Step(5, _GUARDED, _guarded_claim),
    Step(6, _GUARD_ONLY, _guard_only_claim, after_older_transactions=True),
)


async def migrate_schema(
    conn: DbConnection, schema: str, policy: DedupPolicy,
    *, namespace: str | None = None, older_transactions_timeout: float = 300.0,
) -> None:
    """Create or upgrade ``schema``: the dead-letter table and the dedup table of ``policy``
    with its claim function, then (partitioned layout) create the dedup partitions the next
    intervals need, or (table layout) register ``namespace``'s retention; the table layout's
    expired rows are deleted by :func:`~consumerkit.dedup.partitions.maintain`, in short
    transactions of its own.

    A step that must wait for older transactions (:attr:`Step.after_older_transactions`)
    runs after that commit, in a second transaction, once every transaction of the database
    that was running then has ended: at most ``older_transactions_timeout`` seconds. Call it
    outside a transaction (as consumers, receivers and the command line do), so that the first
    transaction's commit is a real one.

    Every identifier is validated before any SQL runs. Raises :class:`StartupError` when the
    database refuses a step, when an older transaction outlasts the timeout, or when the
    dedup table exists with the other layout.
    """
    identifier(schema, "schema name")
    check_dedup_names(schema, policy)
    created = False
    versions = qualified(schema, VERSION_TABLE)
    dedup_steps = TABLE_DEDUP_STEPS if policy.layout == "table" else DEDUP_STEPS
    components = (("core", CORE_STEPS), (f"dedup:{policy.table}", dedup_steps))
    try:
        async with conn.transaction():
            await _lock(conn, schema)
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {identifier(schema)}")
            await conn.execute(
                f"""CREATE TABLE IF NOT EXISTS {versions} (
                    component text NOT NULL,
                    version integer NOT NULL,
                    description text NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now(),
                    PRIMARY KEY (component, version)
                )""")
            await check_layout(conn, schema, policy)
            existing = await applied_versions(conn, schema)
            for component, steps in components:
                created |= await apply_steps(conn, schema, component, steps, policy,
                                             stop_before_wait=True)
            await migrate_parking(conn, schema)
            if policy.layout == "partitioned":
                await record_interval(conn, schema, policy.table, policy.partition_interval)
                await maintain(conn, schema, policy, namespace=namespace)
            elif namespace is not None:
                await register(conn, schema, policy.table, namespace, policy.retention)
        created |= await _steps_after_older_transactions(
            conn, schema, components, policy, existing, older_transactions_timeout)
    except asyncpg.PostgresError as exc:
        hint = ("; a role without DDL rights runs with migrate=False after the owner ran "
                "consumerkit migrate (docs/security.md)"
                if isinstance(exc, asyncpg.InsufficientPrivilegeError) else "")
        raise StartupError(f"migration of schema {schema!r} failed: {exc}{hint}") from exc
    # once, when it matters: the functions were created (or replaced) by this call, and are
    # owned by its role; a migrated schema found again (every start of a consumer) warns not
    if created and await conn.fetchval("SELECT rolsuper FROM pg_catalog.pg_roles "
                                       "WHERE rolname = current_user"):
        log.warning("consumerkit migrate runs as a superuser: the partition maintenance "
                    "functions it creates run with their owner's rights (SECURITY DEFINER); "
                    "run migrate as an owner role that is not a superuser (docs/security.md)")


async def _lock(conn: DbConnection, schema: str) -> None:
    """Take the migration lock of ``schema`` for the caller's transaction."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))",
                       f"consumerkit.migrate\x1f{schema}", LOCK_SEED)


async def _steps_after_older_transactions(
    conn: DbConnection, schema: str, components: tuple[tuple[str, tuple[Step, ...]], ...],
    policy: DedupPolicy, existing: dict[str, int], timeout: float,
) -> bool:
    """Apply the steps left by the first transaction, each after the transactions older
    than its wait have ended; whether any ran. A component this very migration created
    skips the wait: no transaction can have used what the steps before replaced, which
    became visible with it. The wait holds no lock, so other processes migrating at the same
    time (and waiting for the lock) finish their first transaction meanwhile."""
    ran = False
    applied = await applied_versions(conn, schema)
    for component, steps in components:
        if not any(s.after_older_transactions and s.version > applied.get(component, 0)
                   for s in steps):
            continue
        if component in existing:
            if conn.is_in_transaction():  # both steps would commit at once: no wait between
                raise StartupError(
                    f"migration of {component} upgrades in two transactions: call migrate "
                    "on a connection outside a transaction")
            await wait_for_older_transactions(
                conn, timeout, f"migration of {component} waits for the transactions that "
                "may hold the claim function's old locks")
        async with conn.transaction():
            await _lock(conn, schema)
            ran |= await apply_steps(conn, schema, component, steps, policy)
    return ran


async def apply_steps(conn: DbConnection, schema: str, component: str,
                      steps: tuple[Step, ...], policy: DedupPolicy = DEFAULT_POLICY,
                      *, stop_before_wait: bool = False) -> bool:
    """Run the steps of ``component`` not recorded yet, in the caller's transaction (which
    holds the migration lock and has created the version table); whether any ran. With
    ``stop_before_wait``, stop at the first step that must wait for older transactions."""
    versions = qualified(schema, VERSION_TABLE)
    applied = {row["version"] for row in await conn.fetch(
        f"SELECT version FROM {versions} WHERE component = $1", component)}
    ran = False
    for step in steps:
        if step.version in applied:
            continue
        if stop_before_wait and step.after_older_transactions:
            break
        for statement in step.statements(schema, policy):
            await conn.execute(statement)
        await conn.execute(
            f"INSERT INTO {versions} (component, version, description) "
            "VALUES ($1, $2, $3)", component, step.version, step.description)
        ran = True
    return ran


async def applied_versions(conn: DbConnection, schema: str = "consumerkit") -> dict[str, int]:
    """The highest applied version of each component (empty if never migrated)."""
    versions = qualified(schema, VERSION_TABLE)
    if await conn.fetchval("SELECT to_regclass($1)", f"{schema}.{VERSION_TABLE}") is None:
        return {}
    rows = await conn.fetch(
        f"SELECT component, max(version) AS version FROM {versions} GROUP BY component")
    return {row["component"]: row["version"] for row in rows}


async def behind(conn: DbConnection, schema: str, policy: DedupPolicy = DEFAULT_POLICY,
                 ) -> list[str]:
    """Each component of ``schema`` that a migration of this version would upgrade, as
    ``"<component> <applied> of <latest>"`` (empty when it is up to date, or never migrated:
    a missing table is reported as missing)."""
    applied = await applied_versions(conn, schema)
    dedup = TABLE_DEDUP_STEPS if policy.layout == "table" else DEDUP_STEPS
    latest = {"core": CORE_STEPS[-1].version, f"dedup:{policy.table}": dedup[-1].version,
              PARKING: PARKING_STEPS[-1][0]}
    return [f"{component} {applied[component]} of {version}"
            for component, version in latest.items()
            if component in applied and applied[component] < version]


async def check_synchronous_commit(conn: DbConnection) -> str:
    """The session's ``synchronous_commit``. ``off`` means a commit the client saw can vanish
    in a crash after its offset was committed: a lost effect. Callers warn about it."""
    value: str = await conn.fetchval("SELECT current_setting('synchronous_commit')")
    return value
