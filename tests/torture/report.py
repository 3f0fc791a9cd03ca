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
    ("**aborted transactions' records applied** (counted as phantom too)", "aborted_applied"),
    ("records read by the witness while streaming", "witness_read"),
    ("records the broker hid from a streaming reader (witness)", "broker_hidden"),
    ("of the lost, events the broker also kept from the witness", "lost_hidden_by_broker"),
    ("gaps the consumers read again", "consumer_gap_rereads"),
    ("records a consumer's second read found in a gap (hidden by the broker)",
     "consumer_reread_hidden"),
    ("gaps passed at once: transaction markers and aborted transactions the client skipped",
     "consumer_gaps_explained"),
    ("order violations seen by the projection", "projection_violations"),
    ("failovers to a standby held back", "failovers"),
    ("orphan events: published from rows a failover took back", "orphan_events"),
    ("effects of orphan events", "orphan_effects"),
    ("projection violations explained by orphans (sequence numbers used again)",
     "orphan_projection_violations"),
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
            value = report.get(key, 0)
        elif label.startswith("deliveries"):
            value = f"{report['deliveries_total']} / {report['deliveries_distinct']}"
        elif label.startswith("faults"):
            value = f"{report['faults_total']} / {report['fault_kinds']}"
        else:
            value = f"{report['latency_ms']['p50']} / {report['latency_ms']['p99']}"
        lines.append(f"| {label} | {value} |")
    lines += ["", "| fault | injected |", "|---|---|"]
    lines += [f"| {kind} | {n} |" for kind, n in report["faults_by_kind"].items()]
    if report.get("txn_records"):
        lines += ["", "| transactional producers' records | outcome |", "|---|---|"]
        lines += [f"| {outcome} | {n} |" for outcome, n in report["txn_records"].items()]
    lines += ["", "| dead-letter reason | entries |", "|---|---|"]
    lines += [f"| {reason} | {n} |" for reason, n in sorted(report["dead_lettered"].items())]
    if report["parked"]:
        lines += ["", "| parked reason | entries |", "|---|---|"]
        lines += [f"| {reason} | {n} |" for reason, n in sorted(report["parked"].items())]
    return "\n".join(lines) + "\n"


_TOTALS = ("events_committed", "deliveries_total", "deliveries_distinct", "effects",
           "duplicate_effects", "lost", "phantom", "order_violations", "broker_hidden",
           "consumer_reread_hidden", "relay_duplicates", "republished_copies", "faults_total")


def combined(reports: list[dict[str, Any]]) -> str:
    """Several runs (seeds) of one profile as one table, a row per seed and their total,
    then the faults by kind over all of them."""
    head = ["seed", "verdict", *(_short(k) for k in _TOTALS), "kinds", "drain (s)",
            "p50 / p99 (ms)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    kinds: dict[str, int] = {}
    for r in reports:
        for kind, n in r["faults_by_kind"].items():
            kinds[kind] = kinds.get(kind, 0) + n
        lines.append("| " + " | ".join([
            str(r["seed"]), "PASS" if r["verdict"] else "**FAIL**",
            *(f"{r.get(k, 0):,}" for k in _TOTALS), str(r["fault_kinds"]),
            str(r["time_to_drain_s"]),
            f"{r['latency_ms']['p50']} / {r['latency_ms']['p99']}"]) + " |")
    verdict = all(r["verdict"] for r in reports)
    lines.append("| " + " | ".join([
        "**all**", "**PASS**" if verdict else "**FAIL**",
        *(f"**{sum(r.get(k, 0) for r in reports):,}**" for k in _TOTALS),
        f"**{len(kinds)}**",
        "", ""]) + " |")
    lines += ["", "| fault | injected (all seeds) |", "|---|---|"]
    lines += [f"| {kind} | {n} |" for kind, n in sorted(kinds.items())]
    return "\n".join(lines) + "\n"


def _short(key: str) -> str:
    return {"events_committed": "events", "deliveries_total": "deliveries",
            "deliveries_distinct": "distinct", "effects": "effects",
            "duplicate_effects": "dup. effects", "lost": "lost", "phantom": "phantom",
            "order_violations": "order viol.", "broker_hidden": "hidden by broker",
            "consumer_reread_hidden": "hidden, read again",
            "relay_duplicates": "relay dup.",
            "republished_copies": "republished", "faults_total": "faults"}[key]


if __name__ == "__main__":  # python -m tests.torture.report a.json b.json ...
    import json
    import sys
    from pathlib import Path

    print(combined([json.loads(Path(p).read_text()) for p in sys.argv[1:]]), end="")
