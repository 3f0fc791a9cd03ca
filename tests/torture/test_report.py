"""The combined table of several seeds: totals summed, one failing seed fails the whole."""

from __future__ import annotations

from typing import Any

from .report import combined


def _report(seed: int, events: int, lost: int = 0) -> dict[str, Any]:
    return {"seed": seed, "verdict": lost == 0, "events_committed": events,
            "deliveries_total": events + 10, "deliveries_distinct": events + 2,
            "effects": events - lost, "duplicate_effects": 0, "lost": lost, "phantom": 0,
            "order_violations": 0, "relay_duplicates": 3, "republished_copies": 7,
            "faults_total": 180, "fault_kinds": 2, "time_to_drain_s": 0.5,
            "latency_ms": {"p50": 200.0, "p99": 9000.0},
            "faults_by_kind": {"consumer_sigkill": 100, "redis_kill": 80}}


def test_totals_over_the_seeds_and_faults_by_kind() -> None:
    table = combined([_report(1, 340_000), _report(2, 340_001)])
    rows = table.splitlines()
    assert rows[2].startswith("| 1 | PASS | 340,000 | 340,010 |")
    assert rows[4].startswith("| **all** | **PASS** | **680,001** | **680,021** |")
    assert "**360**" in rows[4]  # faults over both seeds
    assert "| consumer_sigkill | 200 |" in rows
    assert "| redis_kill | 160 |" in rows


def test_one_failing_seed_fails_the_whole_run() -> None:
    table = combined([_report(1, 1000), _report(2, 1000, lost=3)])
    assert "| 2 | **FAIL** |" in table
    assert "| **all** | **FAIL** |" in table
