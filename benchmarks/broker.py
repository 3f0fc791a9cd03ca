"""Which broker a run measures on (``--broker tansu|kafka``), and what follows for its topics
and producers.

Tansu (the default) keeps one replica and has no idempotent producer. On Apache Kafka the
suite starts a three-broker KRaft cluster (:func:`tests.harness.kafka.start_kafka`:
``min.insync.replicas=2``, unclean leader election off) unless ``--kafka`` names one; its
topics get ``min(3, brokers)`` replicas, and every producer of the run (the workload's, the
relays' and faststream-outbox's) runs with idempotence on and ``acks=all``, as in production.
Every peer of a run is measured on the same broker; each broker's table comes from a run of
its own.

The functions that create topics or producers take the bootstrap address only, so the traits
are looked up by that address: :func:`declare` records them for the run's broker, and an
address never declared (a test's broker) keeps Tansu's: one replica, no idempotence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

KINDS = ("tansu", "kafka")
KAFKA_BROKERS = 3


@dataclass(frozen=True, slots=True)
class Traits:
    kind: str  # "tansu" or "kafka"
    replication_factor: int = 1
    idempotence: bool = False


TANSU = Traits("tansu")
_DECLARED: dict[str, Traits] = {}


def traits(bootstrap: str) -> Traits:
    """The traits declared for ``bootstrap``, else Tansu's."""
    return _DECLARED.get(bootstrap, TANSU)


@contextlib.contextmanager
def declare(bootstrap: str, kind: str, brokers: int = 1) -> Iterator[Traits]:
    """Record the traits of the broker at ``bootstrap`` (a Kafka one of ``brokers`` nodes) for
    as long as the run uses it."""
    if kind not in KINDS:
        raise ValueError(f"broker kind must be one of {', '.join(KINDS)}, not {kind!r}")
    found = (Traits("kafka", min(KAFKA_BROKERS, max(1, brokers)), True) if kind == "kafka"
             else TANSU)
    _DECLARED[bootstrap] = found
    try:
        yield found
    finally:
        _DECLARED.pop(bootstrap, None)


def producer_flags(bootstrap: str) -> list[str]:
    """The command-line flag of the relay processes for the broker's idempotence."""
    return ["--idempotence"] if traits(bootstrap).idempotence else []
