"""The broker of the test session, chosen by ``CONSUMERKIT_TEST_BROKER`` (``tansu`` or ``kafka``),
and what follows from it for the tests' producers and topics.

Tansu (the default) refuses the idempotent producer (``InitProducerId`` answers UnknownError)
and keeps one replica; Apache Kafka (3 nodes unless ``CONSUMERKIT_TEST_KAFKA_BROKERS=1``, at
``CONSUMERKIT_TEST_KAFKA_VERSION``) runs with idempotence on, the producers' default, and
replication factor 3. ``CONSUMERKIT_TEST_KAFKA_BOOTSTRAP`` still names the address when set;
``CONSUMERKIT_TEST_BROKER`` then says which kind of broker it is.
"""

from __future__ import annotations

import os

from tests.harness.kafka_jars import DEFAULT_KAFKA_VERSION

BROKER_ENV = "CONSUMERKIT_TEST_BROKER"
BROKERS_ENV = "CONSUMERKIT_TEST_KAFKA_BROKERS"
VERSION_ENV = "CONSUMERKIT_TEST_KAFKA_VERSION"


def _choice(env: str, default: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(env, "").strip().lower() or default
    if value not in allowed:
        raise SystemExit(f"{env}={value!r}: expected one of {', '.join(allowed)}")
    return value


BROKER = _choice(BROKER_ENV, "tansu", ("tansu", "kafka"))
ON_KAFKA = BROKER == "kafka"
KAFKA_BROKERS = int(_choice(BROKERS_ENV, "3", ("1", "3")))
KAFKA_VERSION = os.environ.get(VERSION_ENV, "").strip() or DEFAULT_KAFKA_VERSION
REPLICATION_FACTOR = KAFKA_BROKERS if ON_KAFKA else 1
# The producers' own default on Apache Kafka; Tansu cannot give a producer id.
IDEMPOTENCE = ON_KAFKA
PRODUCER_OPTIONS: dict[str, object] = {"enable_idempotence": IDEMPOTENCE}
# The CLI's spelling of the same choice (``consumerkit run/relay``).
IDEMPOTENCE_FLAG: tuple[str, ...] = () if IDEMPOTENCE else ("--no-enable-idempotence",)
