"""The parked keys' tables, created by ``consumerkit migrate`` (component ``parking``).

``parked_keys``: one row per key parked on a partition; the consumer and ``replay`` both lock
it (``FOR UPDATE``) before they add or remove records of the key, which orders a park that
races with the end of a replay. ``parked_records``: the records of a parked key, in offset
order, with their exact bytes, why they were parked and, once replayed, when.
``parked_audit``: one row per replay or discard, with who did it, when, and how many records.
"""

from __future__ import annotations

from ..shared.identifiers import identifier, qualified
from ..types import DbConnection

KEYS = "parked_keys"
RECORDS = "parked_records"
AUDIT = "parked_audit"
COMPONENT = "parking"
VERSION_TABLE = "consumerkit_schema_version"  # created by consumerkit.migrate


def parking_ddl(schema: str) -> list[str]:
    """Statements creating the three tables (version 1 of component ``parking``)."""
    return [
        f"""CREATE TABLE IF NOT EXISTS {qualified(schema, KEYS)} (
            consumer text NOT NULL,
            topic text NOT NULL,
            "partition" integer NOT NULL,
            key bytea NOT NULL,
            reason text NOT NULL,
            detail text NOT NULL,
            parked_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (consumer, topic, "partition", key)
        )""",
        f"""CREATE TABLE IF NOT EXISTS {qualified(schema, RECORDS)} (
            id bigserial PRIMARY KEY,
            consumer text NOT NULL,
            topic text NOT NULL,
            "partition" integer NOT NULL,
            "offset" bigint NOT NULL,
            key bytea NOT NULL,
            value bytea,
            headers jsonb NOT NULL DEFAULT '[]',
            timestamp_ms bigint,
            event_id text,
            event_type text,
            reason text NOT NULL,
            detail text NOT NULL,
            attempts integer NOT NULL DEFAULT 0,
            parked_at timestamptz NOT NULL DEFAULT now(),
            replayed_at timestamptz,
            UNIQUE (consumer, topic, "partition", "offset")
        )""",
        f"""CREATE INDEX IF NOT EXISTS {identifier(RECORDS + "_by_key")}
            ON {qualified(schema, RECORDS)} (consumer, topic, "partition", key, "offset")""",
        f"""CREATE TABLE IF NOT EXISTS {qualified(schema, AUDIT)} (
            id bigserial PRIMARY KEY,
            consumer text NOT NULL,
            topic text NOT NULL,
            "partition" integer NOT NULL,
            key bytea NOT NULL,
            action text NOT NULL CHECK (action IN ('replayed', 'discarded')),
            records integer NOT NULL,
            actor text NOT NULL,
            db_role text NOT NULL DEFAULT current_user,
            done_at timestamptz NOT NULL DEFAULT now()
        )""",
    ]


STEPS = ((1, "parked keys, their records and the audit of replays and discards", parking_ddl),)


async def migrate_parking(conn: DbConnection, schema: str) -> None:
    """Create or upgrade the parking tables; called by
    :func:`consumerkit.schema.migrate_schema` inside its transaction (after the schema and the
    version table exist)."""
    versions = qualified(schema, VERSION_TABLE)
    applied = {row["version"] for row in await conn.fetch(
        f"SELECT version FROM {versions} WHERE component = $1", COMPONENT)}
    for version, description, statements in STEPS:
        if version in applied:
            continue
        for statement in statements(schema):
            await conn.execute(statement)
        await conn.execute(
            f"INSERT INTO {versions} (component, version, description) VALUES ($1, $2, $3)",
            COMPONENT, version, description)
