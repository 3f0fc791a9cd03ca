"""Run sizes. ``short`` is CI's (at least 5,000 events and 20 faults of 8 kinds or more);
``mutant`` is the small size at which every negative control must still be caught; ``soak``
is several times ``short``; ``failover-kafka`` is the failover fault's negative control
(offsets kept in Kafka: it must lose effects); ``long`` is the one to publish: run with
several seeds, together they make at least 1,000,000 events and 500 faults of every kind (one
seed is about 25 minutes on a 2-core machine, so a failing seed does not cost the whole
run); ``kafka-long`` is its counterpart on three Apache Kafka brokers."""

from __future__ import annotations

from dataclasses import dataclass

from .faults import KINDS
from .kafka_faults import KAFKA_KINDS


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    events: int
    aggregates: int
    rate: float  # events per second the producers aim at
    faults: int
    fault_gap: float  # seconds between two faults (jittered)
    warmup: float  # seconds without faults
    cache: bool  # consumers use the Redis dedup cache
    partitions: int = 6
    # "kafka": a three-node Apache Kafka with fault proxies, the broker faults among the
    # kinds, and transactional producers sending ``txn_events`` straight to the topic
    broker: str = "tansu"
    txn_events: int = 0
    drain_timeout: float = 120.0  # give up (and report what is missing) after this long
    stall_timeout: float = 25.0  # ... or after this long without progress
    kinds: tuple[str, ...] = ()  # the fault kinds to draw from; () for all of them
    # a primary with a streaming standby, and the failover fault among the kinds
    failover: bool = False
    offset_store: str = "kafka"  # where the consumers keep their offsets


ALL_KINDS = list(KINDS)
# today's faults the kafka profile draws besides the broker faults (broker_pause there
# freezes one node)
KAFKA_WITH = ("consumer_sigkill", "failpoint_before_commit", "failpoint_after_commit",
              "consumer_zombie", "membership_churn", "pg_terminate_consumers",
              "relay_sigkill_after_publish", "postgres_restart", "broker_pause",
              "long_transaction", "poison", "republish")

PROFILES = {
    # the producers' rate spreads the events over the chaos phase (faults take ~3 s each)
    "short": Profile("short", events=6000, aggregates=200, rate=70.0, faults=24,
                     fault_gap=1.0, warmup=4.0, cache=True, failover=True,
                     offset_store="postgres"),
    # the faults that give each broken variant its chance to show, and some others
    "mutant": Profile("mutant", events=1200, aggregates=40, rate=45.0, faults=10,
                      fault_gap=0.5, warmup=2.0, cache=True, stall_timeout=8.0, kinds=(
                          "consumer_sigkill", "failpoint_after_claim",
                          "failpoint_before_commit", "failpoint_after_commit",
                          "failpoint_after_cache_write", "long_transaction", "republish",
                          "zombie_after_claim")),
    # CI's broker-failure run on Apache Kafka: every broker fault once, with some of today's
    "kafka": Profile("kafka", events=2500, aggregates=100, rate=30.0, faults=len(KAFKA_KINDS)
                     + len(KAFKA_WITH), fault_gap=1.0, warmup=4.0, cache=False,
                     broker="kafka", txn_events=600, stall_timeout=60.0, drain_timeout=240.0,
                     kinds=(*KAFKA_KINDS, *KAFKA_WITH)),
    # the negative control of aborted transactions (mutant read_uncommitted): a few faults
    "kafka-mutant": Profile("kafka-mutant", events=600, aggregates=20, rate=30.0, faults=3,
                            fault_gap=1.0, warmup=3.0, cache=False, broker="kafka",
                            txn_events=300, stall_timeout=30.0, kinds=(
                                "leader_move", "consumer_sigkill", "republish")),
    # between the two: what fits in ten minutes on a 2-core machine
    "soak": Profile("soak", events=40_000, aggregates=1000, rate=110.0, faults=100,
                    fault_gap=0.8, warmup=5.0, cache=True, drain_timeout=300.0,
                    stall_timeout=60.0, failover=True, offset_store="postgres"),
    # the negative control of the failover fault: offsets in Kafka, so the effects applied
    # while the standby was held back are lost with the primary (the run must fail)
    "failover-kafka": Profile("failover-kafka", events=1500, aggregates=40, rate=50.0,
                              faults=4, fault_gap=2.0, warmup=3.0, cache=False,
                              stall_timeout=10.0, failover=True, kinds=(
                                  "postgres_failover", "consumer_sigkill", "republish")),
    # the Apache Kafka one to publish: broker faults beside the consumers' and the database's
    # (a failover to a lagging standby among them, offsets in PostgreSQL), transactional
    # producers upstream; two seeds make 1,000,000 events and 500 faults
    "kafka-long": Profile("kafka-long", events=500_000, aggregates=5000, rate=420.0,
                          faults=250, fault_gap=0.6, warmup=10.0, cache=False,
                          broker="kafka", txn_events=12_000, drain_timeout=900.0,
                          stall_timeout=120.0, failover=True, offset_store="postgres",
                          kinds=(*KAFKA_KINDS, *KAFKA_WITH, "postgres_failover")),
    "long": Profile("long", events=340_000, aggregates=5000, rate=500.0, faults=180,
                    fault_gap=0.6, warmup=10.0, cache=True, drain_timeout=900.0,
                    stall_timeout=120.0, failover=True, offset_store="postgres"),
}
