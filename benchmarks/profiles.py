"""The cells of the quick and the full profile.

A cell is one workload (messages, keys and their spread, duplicates, handler cost, dedup
table state, replay) measured on a set of peers, each ``runs`` times, interleaved. Cells with
``latency`` also measure each peer's end-to-end latency at a fixed offered load. The cleanup
cell compares dropping a partition with deleting the same rows while a consumer runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .cleanup import CleanupSpec
from .latency import Pace
from .lineup import MAIN_PEERS, SUITE
from .outbox_peers import RelaySpec
from .peer_consumerkit import SWEEP, variant
from .runner import Settings

MAIN = "main"
REDIS = "dup50"
REPLAY = "replay"


@dataclass(frozen=True, slots=True)
class Cell:
    name: str
    title: str
    settings: Settings
    peers: tuple[str, ...] = SUITE
    latency: Pace | None = None
    latency_peers: tuple[str, ...] | None = None  # None: every peer of the cell


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    cells: tuple[Cell, ...]
    cleanup: CleanupSpec | None = None
    relay: RelaySpec | None = None  # consumerkit's relay against faststream-outbox
    extra_peers: dict[str, type] = field(default_factory=dict)  # sweep variants by name


def _base(events: int) -> Settings:
    return Settings(events=events, keys=1_000, dup_rate=0.10, runs=3, deadline=300.0)


def quick() -> Profile:
    base = _base(2_000)
    return Profile("quick", (
        Cell(MAIN, "1,000 keys uniform, one upsert, 10 % duplicates", base,
             peers=MAIN_PEERS, latency=Pace(events=400, rate=200.0),
             latency_peers=SUITE),
        # 20,000 messages: the consumer fetches up to max_in_flight (5,000) ahead, and a
        # duplicate fetched before its original committed cannot hit the cache; in a short
        # stream almost none can. Only the two peers the Redis target compares.
        Cell(REDIS, "1,000 keys uniform, one upsert, 50 % duplicates",
             replace(base, events=20_000, dup_rate=0.5),
             peers=("consumerkit", "consumerkit-redis")),
        Cell(REPLAY, "replay burst: the consumer restarts from offset 0 (all duplicates)",
             replace(base, events=4_000, replay=True),
             peers=("consumerkit", "consumerkit-redis")),
    ), CleanupSpec(rows=500_000, pace=Pace(events=1_800, rate=300.0), at=1.5),
        RelaySpec(rows=2_000, runs=1))


def full() -> Profile:
    base = _base(20_000)
    small = replace(base, events=4_000)
    sweep = {v.name: v for v in (variant(options) for options in SWEEP)}
    return Profile("full", (
        # five rounds: the targets judged on each round's ratio (metrics on/off) get five
        Cell(MAIN, "1,000 keys uniform, one upsert, 10 % duplicates", replace(base, runs=5),
             peers=MAIN_PEERS, latency=Pace(events=1_000, rate=200.0), latency_peers=SUITE),
        Cell("dup0", "1,000 keys uniform, one upsert, no duplicates", replace(base, dup_rate=0.0)),
        Cell(REDIS, "1,000 keys uniform, one upsert, 50 % duplicates", replace(base, dup_rate=0.5)),
        Cell(REPLAY, "replay burst: the consumer restarts from offset 0 (all duplicates)",
             replace(small, replay=True)),
        Cell("keys1", "one key, one upsert, 10 % duplicates", replace(small, keys=1)),
        Cell("keys10zipf", "10 keys Zipf, one upsert, 10 % duplicates",
             replace(small, keys=10, spread="zipf")),
        Cell("cost-none", "1,000 keys uniform, no handler work, 10 % duplicates",
             replace(base, cost="none")),
        Cell("cost-io", "1,000 keys uniform, a 5 ms awaited call then the upsert, 10 % dup.",
             replace(small, events=2_000, cost="io"),
             latency=Pace(events=600, rate=100.0, cost="io")),
        Cell("prefilled", "as main, dedup table pre-filled with 1,000,000 ids over 7 days",
             replace(small, prefill=1_000_000),
             peers=("textbook", "tuned", "set-based", "consumerkit", "consumerkit-best")),
        Cell("sweep", "consumerkit settings against each other (main workload)", base,
             peers=("textbook", "consumerkit", *sweep)),
    ), CleanupSpec(rows=5_000_000, pace=Pace(events=12_000, rate=300.0), at=5.0, repeats=3),
        # faststream-outbox's defaults relay ~200 events/s here: 5,000 rows keep its three
        # runs near a minute and a half
        RelaySpec(rows=5_000, runs=3), extra_peers=sweep)


PROFILES = {"quick": quick, "full": full}
