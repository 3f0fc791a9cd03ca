"""The report as Markdown, for the docs: the same figures as the JSON."""

from __future__ import annotations

from typing import Any

_ROWS = [
    ("events committed", "events_committed"),
    ("poison events committed (must be dead-lettered)", "poison_committed"),
    ("malformed records put on the topic", "raw_poison_records"),
    ("relay duplicates (extra copies on the topic)", "relay_duplicates"),
    ("copies re-published on purpose", "republished_copies"),
    ("deliveries total / distinct", None),
    ("effects applied", "effects"),
    ("**duplicate effects**", "duplicate_effects"),
    ("**lost**", "lost"),
    ("**phantom**", "phantom"),
    ("**order violations**", "order_violations"),
    ("order violations seen by the projection", "projection_violations"),
    ("unexpected dead letters (sound events)", "unexpected_dead_letters"),
    ("faults injected / kinds", None),
    ("faults armed but not reached", "faults_not_reached"),
    ("time to drain (s)", "time_to_drain_s"),
    ("end-to-end latency p50 / p99 (ms)", None),
]


def markdown(report: dict[str, Any]) -> str:
    mutant = report["mutant"] or "none"
    lines = [
        f"### Torture run: profile `{report['profile']}`, seed {report['seed']}, "
        f"mutant {mutant}",
        "",
        f"Verdict: **{'PASS' if report['verdict'] else 'FAIL'}**",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    for label, key in _ROWS:
        if key is not None:
            value = report[key]
        elif label.startswith("deliveries"):
            value = f"{report['deliveries_total']} / {report['deliveries_distinct']}"
        elif label.startswith("faults"):
            value = f"{report['faults_total']} / {report['fault_kinds']}"
        else:
            value = f"{report['latency_ms']['p50']} / {report['latency_ms']['p99']}"
        lines.append(f"| {label} | {value} |")
    lines += ["", "| fault | injected |", "|---|---|"]
    lines += [f"| {kind} | {n} |" for kind, n in report["faults_by_kind"].items()]
    lines += ["", "| dead-letter reason | entries |", "|---|---|"]
    lines += [f"| {reason} | {n} |" for reason, n in sorted(report["dead_lettered"].items())]
    if report["parked"]:
        lines += ["", "| parked reason | entries |", "|---|---|"]
        lines += [f"| {reason} | {n} |" for reason, n in sorted(report["parked"].items())]
    return "\n".join(lines) + "\n"
