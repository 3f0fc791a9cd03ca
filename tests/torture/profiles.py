"""Run sizes. ``short`` is CI's (at least 5,000 events and 20 faults of 8 kinds or more);
``mutant`` is the small size at which every negative control must still be caught; ``soak``
is several times ``short``; ``failover-kafka`` is the failover fault's negative control
(offsets kept in Kafka: it must lose effects); ``long`` is the one to publish: run with
several seeds, together they make at least 1,000,000 events and 500 faults of every kind (one
seed is about 25 minutes on a 2-core machine, so a failing seed does not cost the whole
run)."""

from __future__ import annotations

from dataclasses import dataclass

from .faults import KINDS


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
    drain_timeout: float = 120.0  # give up (and report what is missing) after this long
    stall_timeout: float = 25.0  # ... or after this long without progress
    kinds: tuple[str, ...] = ()  # the fault kinds to draw from; () for all of them
    # a primary with a streaming standby, and the failover fault among the kinds
    failover: bool = False
    offset_store: str = "kafka"  # where the consumers keep their offsets


ALL_KINDS = list(KINDS)

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
                          "failpoint_after_cache_write", "long_transaction", "republish")),
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
    "long": Profile("long", events=340_000, aggregates=5000, rate=500.0, faults=180,
                    fault_gap=0.6, warmup=10.0, cache=True, drain_timeout=900.0,
                    stall_timeout=120.0, failover=True, offset_store="postgres"),
}
