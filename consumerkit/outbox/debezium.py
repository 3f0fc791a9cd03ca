"""The Debezium connector that reads an outbox table and emits consumerkit's wire format.

:func:`event_router_config` is the one source of the connector's settings:
``examples/debezium_outbox.json`` and the docs are checked against it, and
``consumerkit.testing.start_debezium`` runs it. Only the connection settings
(:data:`CONNECTION_KEYS`) differ between deployments: the slot and the publication are the
ones ``consumerkit migrate --outbox-cdc`` made (:func:`~consumerkit.outbox.prepare_cdc`).
"""

from __future__ import annotations

from collections.abc import Mapping

from .table import OutboxTable

__all__ = ["CONNECTION_KEYS", "CONNECTOR_CLASS", "HEADERS_HEADER", "event_router_config"]

CONNECTOR_CLASS = "io.debezium.connector.postgresql.PostgresConnector"
HEADERS_HEADER = "headers"
"""The header that carries the writer's headers (the ``headers`` column) as one JSON object:
the EventRouter can place a column in a header but cannot expand it into several."""

CONNECTION_KEYS = frozenset({
    "database.hostname", "database.port", "database.user", "database.password",
    "database.dbname", "topic.prefix",
})


EXAMPLE_TABLE = OutboxTable("public", "outbox")


def event_router_config(table: OutboxTable = EXAMPLE_TABLE) -> dict[str, str]:
    """The connector settings that make the EventRouter emit the relay's wire format from
    ``table``: key = aggregate id, value = the JSON payload, headers ``id``, ``event_type``,
    ``aggregate_type``, ``occurred_at`` and ``headers`` (the writer's), topic = aggregate type.

    The slot and the publication are the ones :func:`~consumerkit.outbox.prepare_cdc`
    creates before the first event (``consumerkit migrate --outbox-cdc``), which the
    connector must not create itself: a slot it creates at its first start keeps no event
    committed before, and a publication it creates would hold every table
    (``autocreate.mode=all_tables``), so that it decodes every dedup insert, or, for an outbox
    kept in time partitions, each partition under its own name, where the EventRouter would
    see no row of the table it was given. The connector then needs no more than to read.
    ``snapshot.mode=no_data``: a first start streams from the slot's creation on; the
    default (``initial``) would stream from its snapshot's position instead, skipping what the
    slot kept before it, the very events written ahead of the connector (a delete-at-insert
    outbox's rows are gone, so no snapshot finds them either)."""
    router = "transforms.outbox."
    return {
        "connector.class": CONNECTOR_CLASS,
        "plugin.name": "pgoutput",
        "table.include.list": f"{table.schema}.{table.table}",
        "extended.headers.enabled": "false",  # no __debezium.context.* headers: the relay's set
        "transforms": "outbox",
        f"{router}type": "io.debezium.transforms.outbox.EventRouter",
        f"{router}table.field.event.id": "id",
        f"{router}table.field.event.key": "aggregateid",
        f"{router}table.field.event.payload": "payload",
        f"{router}route.by.field": "aggregatetype",
        f"{router}route.topic.replacement": "${routedByValue}",
        f"{router}table.fields.additional.placement": (
            "type:header:event_type,aggregatetype:header:aggregate_type,"
            f"occurred_at:header:occurred_at,headers:header:{HEADERS_HEADER}"),
        "key.converter": "org.apache.kafka.connect.storage.StringConverter",
        "value.converter": "org.apache.kafka.connect.storage.StringConverter",
        "header.converter": "org.apache.kafka.connect.storage.SimpleHeaderConverter",
        "snapshot.mode": "no_data",
        "slot.name": table.replication_slot,
        "publication.name": table.publication,
        "publication.autocreate.mode": "disabled",
    }


def deployment_settings(config: Mapping[str, str]) -> dict[str, str]:
    """``config`` without its connection settings: what must equal :func:`event_router_config`
    for the table it names (the slot and the publication included: the migration's)."""
    return {k: v for k, v in config.items() if k not in CONNECTION_KEYS}
