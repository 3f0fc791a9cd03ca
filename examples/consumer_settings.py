"""A consumer on a secured cluster: options for both Kafka clients, options for the consumer
only, and the sizing knobs."""

from __future__ import annotations

import ssl

import examples.billing
from consumerkit import Consumer


def build(kafka: str, postgres: str, kafka_password: str) -> Consumer:
    return Consumer(
        name="billing",
        handlers=[examples.billing.billing],
        topics=["orders"],
        kafka_bootstrap=kafka,
        postgres_dsn=postgres,  # e.g. "postgresql://billing:secret@db/billing?sslmode=verify-full"
        kafka_options={  # the consumer AND the dead-letter producer: options both accept
            "security_protocol": "SASL_SSL",
            "ssl_context": ssl.create_default_context(),
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "billing",
            "sasl_plain_password": kafka_password,
            "client_id": "billing",
        },
        kafka_consumer_options={  # the consumer only
            "session_timeout_ms": 30_000,
            "heartbeat_interval_ms": 3_000,
            "rebalance_timeout_ms": 60_000,  # a revocation waits at most half of it
            "max_poll_records": 500,         # the most records one fetch asks for
        },
        concurrency=32,         # transactions at once (the pool holds 34 connections)
        max_in_flight=2_000,    # records fetched and not yet settled
        handler_timeout=30.0,   # a handler call still running after 30 s fails its attempt
        shutdown_timeout=20.0,  # how long stop() waits for running handlers
    )



# billing handles two of the event types of "orders": what becomes of the others
def skipping() -> Consumer:
    return Consumer(name="billing", handlers=[examples.billing.billing], topics=["orders"],
                    unhandled="skip")  # every type without a handler: skipped


def ignoring() -> Consumer:
    return Consumer(name="billing", handlers=[examples.billing.billing], topics=["orders"],
                    ignore=["order.internal.*"])  # these skipped, any other dead-lettered
