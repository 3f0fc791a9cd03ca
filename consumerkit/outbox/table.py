"""The outbox tables, their names and lock keys, and the outbox's migration steps.

Five tables per outbox (``T`` is the outbox table's name, ``outbox`` by default):

- ``T``: the events. Writers only INSERT; the relay DELETEs a row once the destination
  acknowledged it. No UPDATE ever touches it, so Debezium's EventRouter (which warns on
  updates and ignores deletes) can read the same table.
- ``T_failures``: the relay's state for rows whose publication failed (attempts, last error,
  next attempt, FAILED flag), kept apart so that the outbox table never sees an UPDATE.
- ``T_keys``: the optional idempotency keys, kept apart because outbox rows are deleted once
  published and a key must keep refusing duplicates after that.
- ``T_leases`` and ``T_relays``: slot leases and live relays, held by expiry, for relays
  behind a transaction pooler (no session for advisory locks: :mod:`~consumerkit.outbox.leases`).

Column names follow Debezium's outbox defaults (``id``, ``aggregatetype``, ``aggregateid``,
``type``, ``payload``). ``slot`` is computed by the database from the aggregate, one of
:data:`SLOTS`; relays own slots, never rows. An outbox read by change data capture may keep
its events for a retention instead, in time partitions (:mod:`~consumerkit.outbox.retention`).
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

import asyncpg

from ..dedup.ddl_functions import record_interval
from ..dedup.partitions import LOCK_SEED, maintain
from ..errors import ConfigurationError, StartupError
from ..schema import CORE_STEPS, VERSION_TABLE, apply_steps
from ..shared.identifiers import identifier, qualified
from ..types import DbConnection
from .retention import OutboxRetention, check_outbox_layout, ensure_publication, plan

SLOTS = 64
"""How many slots aggregates are hashed into: the most relays that can share the work."""

_MEMBERS_SLOT = 2_147_483_647  # the lock key every live relay holds shared


@dataclass(frozen=True, slots=True)
class OutboxTable:
    """Where an outbox lives: ``schema.table`` and its side tables, all names validated.
    With ``retention``, the events are kept that long in time partitions, for change data
    capture (:mod:`~consumerkit.outbox.retention`); without, the relay deletes each row it
    published."""

    schema: str = "consumerkit"
    table: str = "outbox"
    retention: OutboxRetention | None = None

    def __post_init__(self) -> None:
        identifier(self.schema, "schema name")
        identifier(self.table, "outbox table name")
        if len(self.table) > 54:
            raise ConfigurationError("outbox table name: at most 54 characters (side tables "
                                     "append _failures)")
        if self.retention is not None and len(self.table) > 51:
            raise ConfigurationError("outbox table name: at most 51 characters with a "
                                     "retention (partitions append _pYYYYMMDDHH)")

    @property
    def events(self) -> str:
        return qualified(self.schema, self.table)

    @property
    def failures(self) -> str:
        return qualified(self.schema, f"{self.table}_failures")

    @property
    def keys(self) -> str:
        return qualified(self.schema, f"{self.table}_keys")

    @property
    def leases(self) -> str:
        """The relays' slot leases, for relays behind a transaction pooler (no session)."""
        return qualified(self.schema, f"{self.table}_leases")

    @property
    def members(self) -> str:
        """The live relays behind a transaction pooler, each row renewed by its relay."""
        return qualified(self.schema, f"{self.table}_relays")

    @property
    def publication(self) -> str:
        """The publication of a partitioned outbox, which change data capture reads:
        ``{schema}_{table}_cdc`` (publication names are per database, not per schema), or
        ``{table}_cdc_{hash}`` when that would pass 63 characters."""
        name = f"{self.schema}_{self.table}_cdc"
        if len(name) <= 63:
            return name
        digest = hashlib.blake2b(f"{self.schema}.{self.table}".encode(), digest_size=4)
        return f"{self.table}_cdc_{digest.hexdigest()}"

    @property
    def replication_slot(self) -> str:
        """The logical replication slot ``consumerkit migrate --outbox-cdc`` creates for change
        data capture, named as the publication (slots and publications have separate
        namespaces)."""
        return self.publication

    @property
    def lock_class(self) -> int:
        """The first half of the relays' two-key advisory locks: one per outbox table."""
        return zlib.crc32(f"consumerkit.outbox\x1f{self.schema}.{self.table}".encode()) & (
            0x7FFF_FFFF)

    @property
    def members_lock(self) -> tuple[int, int]:
        """Held shared by every live relay of this table: counting holders counts relays."""
        return self.lock_class, _MEMBERS_SLOT

    @property
    def channel(self) -> str:
        """The LISTEN/NOTIFY channel writers notify and relays listen on."""
        digest = hashlib.blake2b(f"{self.schema}.{self.table}".encode(), digest_size=8)
        return f"consumerkit_outbox_{digest.hexdigest()}"

    def aggregate_lock(self, aggregate_type: str, aggregate_id: str) -> int:
        """The writer's transaction lock key for one aggregate (a signed 64-bit integer)."""
        digest = hashlib.blake2b(
            f"{self.schema}.{self.table}\x1f{aggregate_type}\x1f{aggregate_id}".encode(),
            digest_size=8)
        return int.from_bytes(digest.digest(), "big", signed=True)


def outbox_ddl(t: OutboxTable) -> list[str]:
    """Version 1: the outbox table, its failure side table and its idempotency keys."""
    return [
        f"""CREATE TABLE {t.events} (
            seq bigserial PRIMARY KEY,
            id uuid NOT NULL UNIQUE,
            aggregatetype text NOT NULL,
            aggregateid text NOT NULL,
            type text NOT NULL,
            payload jsonb NOT NULL,
            occurred_at timestamptz NOT NULL,
            headers jsonb NOT NULL DEFAULT '{{}}',
            slot smallint NOT NULL GENERATED ALWAYS AS (
                abs(hashtextextended(aggregatetype || chr(31) || aggregateid, 0) % {SLOTS})
            ) STORED
        )""",
        f"CREATE INDEX ON {t.events} (slot, seq)",
        f"CREATE INDEX ON {t.events} (occurred_at)",
        *side_tables_ddl(t),
    ]


def side_tables_ddl(t: OutboxTable) -> list[str]:
    """The relay's failure state and the writers' idempotency keys."""
    return [
        f"""CREATE TABLE {t.failures} (
            seq bigint PRIMARY KEY,
            event_id uuid NOT NULL,
            event_type text NOT NULL,
            aggregatetype text NOT NULL,
            aggregateid text NOT NULL,
            attempts integer NOT NULL,
            last_error text NOT NULL,
            next_attempt_at timestamptz NOT NULL,
            failed boolean NOT NULL DEFAULT false,
            updated_at timestamptz NOT NULL DEFAULT now()
        )""",
        f"CREATE INDEX ON {t.failures} (aggregatetype, aggregateid, seq)",
        f"""CREATE TABLE {t.keys} (
            dedup_key text PRIMARY KEY,
            id uuid NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now()
        )""",
        f"CREATE INDEX ON {t.keys} (created_at)",
    ]


def partitioned_ddl(t: OutboxTable) -> list[str]:
    """Version 1 with a retention: the events range-partitioned on ``created_at`` (the
    database's time of the insert), no ``slot`` and no unique ``id`` (a partitioned table's
    unique keys must hold its partition key), and the same side tables."""
    return [
        f"""CREATE TABLE {t.events} (
            seq bigserial NOT NULL,
            id uuid NOT NULL,
            aggregatetype text NOT NULL,
            aggregateid text NOT NULL,
            type text NOT NULL,
            payload jsonb NOT NULL,
            occurred_at timestamptz NOT NULL,
            headers jsonb NOT NULL DEFAULT '{{}}',
            created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (seq, created_at)
        ) PARTITION BY RANGE (created_at)""",
        f"CREATE INDEX ON {t.events} (id)",
        *side_tables_ddl(t),
    ]


def leases_ddl(t: OutboxTable) -> list[str]:
    """Version 2: slot leases and relay membership, held by expiry instead of by a session
    (relays behind a transaction pooler, :mod:`~consumerkit.outbox.leases`)."""
    return [
        f"""CREATE TABLE {t.leases} (
            slot smallint PRIMARY KEY,
            holder text NOT NULL,
            expires_at timestamptz NOT NULL
        )""",
        f"""CREATE TABLE {t.members} (
            holder text PRIMARY KEY,
            expires_at timestamptz NOT NULL
        )""",
    ]


OUTBOX_STEPS = ((1, "outbox table, failure side table and idempotency keys", outbox_ddl),
                (2, "slot leases and relay membership without a session", leases_ddl))
PARTITIONED_OUTBOX_STEPS = (
    (1, "outbox partitioned by time for a retention, failure side table and idempotency keys",
     partitioned_ddl),
    # a relay may publish such an outbox too, behind a transaction pooler like any other
    (2, "slot leases and relay membership without a session", leases_ddl))


async def migrate_outbox(conn: DbConnection, t: OutboxTable) -> None:
    """Create or upgrade one outbox, for :func:`consumerkit.migrate`: its steps are component
    ``outbox:<table>`` of the schema's version table, applied under the same advisory lock as
    the schema's, so processes may race to run it. With a retention, also the schema's core
    steps (the partition functions), the publication change data capture reads and the
    partitions ahead. Raises :class:`StartupError` when the database refuses a step or the
    table exists with the other layout."""
    versions = qualified(t.schema, VERSION_TABLE)
    component = f"outbox:{t.table}"
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, $2))",
                               f"consumerkit.migrate\x1f{t.schema}", LOCK_SEED)
            await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {identifier(t.schema)}")
            await conn.execute(
                f"""CREATE TABLE IF NOT EXISTS {versions} (
                    component text NOT NULL,
                    version integer NOT NULL,
                    description text NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now(),
                    PRIMARY KEY (component, version)
                )""")
            await check_outbox_layout(conn, t)
            if t.retention is not None:
                await apply_steps(conn, t.schema, "core", CORE_STEPS)
            applied = {r["version"] for r in await conn.fetch(
                f"SELECT version FROM {versions} WHERE component = $1", component)}
            steps = OUTBOX_STEPS if t.retention is None else PARTITIONED_OUTBOX_STEPS
            for version, description, statements in steps:
                if version in applied:
                    continue
                for statement in statements(t):
                    await conn.execute(statement)
                await conn.execute(
                    f"INSERT INTO {versions} (component, version, description) "
                    "VALUES ($1, $2, $3)", component, version, description)
            if t.retention is not None:
                await record_interval(conn, t.schema, t.table, t.retention.partition_interval)
                await ensure_publication(conn, t)
                await maintain(conn, t.schema, plan(t))
    except asyncpg.PostgresError as exc:
        raise StartupError(f"migration of outbox {t.schema}.{t.table} failed: {exc}") from exc
