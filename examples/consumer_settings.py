"""A consumer on a secured cluster: options for both Kafka clients, options for the consumer
only, and the sizing knobs."""

from __future__ import annotations

import examples.billing
from consumerkit import Consumer, Kafka, Limits, Postgres, Timeouts, Unhandled


def build(kafka: str, postgres: str, kafka_password: str) -> Consumer:
    return Consumer(
        name="billing",
        handlers=[examples.billing.billing],
        topics=["orders"],
        # e.g. "postgresql://billing:secret@db/billing?sslmode=verify-full"
        postgres=Postgres(dsn=postgres),
        kafka=Kafka(
            bootstrap=kafka,
            # TLS and SASL for the consumer AND the dead-letter producer
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username="billing",
            sasl_plain_password=kafka_password,
            options={"client_id": "billing"},  # any other option both clients accept
            consumer_options={  # the consumer only
                "session_timeout_ms": 30_000,
                "heartbeat_interval_ms": 3_000,
                "rebalance_timeout_ms": 60_000,  # a revocation waits at most half of it
                "max_poll_records": 500,         # the most records one fetch asks for
            },
        ),
        limits=Limits(
            concurrency=32,       # transactions at once (the pool holds 34 connections)
            max_in_flight=2_000,  # records fetched and not yet settled
        ),
        timeouts=Timeouts(
            handler=30.0,   # a handler call still running after 30 s fails its attempt
            shutdown=20.0,  # how long stop() waits for running handlers
        ),
    )


# billing handles two of the event types of "orders": what becomes of the others
def skipping() -> Consumer:
    return Consumer(name="billing", handlers=[examples.billing.billing], topics=["orders"],
                    unhandled=Unhandled(policy="skip"))  # every type without a handler: skipped


def ignoring() -> Consumer:
    return Consumer(name="billing", handlers=[examples.billing.billing], topics=["orders"],
                    # these skipped, any other dead-lettered
                    unhandled=Unhandled(ignore=["order.internal.*"]))
