"""The Markdown summary of a suite run: one table per cell, the cleanup passes, the targets,
and the run's context."""

from __future__ import annotations

from typing import Any


def _n(value: float | None, fmt: str = ",.0f") -> str:
    return "-" if value is None else format(value, fmt)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.1f}"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def _peer_row(p: dict[str, Any]) -> str:
    if p["unavailable"]:
        return f"| {p['peer']} | unavailable: {p['unavailable']} |" + " |" * 10
    if not p["exact"]:
        problems = "; ".join(f"run {s['run']}: {s['detail']}" for s in p["samples"]
                             if not s["exact"])
        if p["latency"] and not p["latency"].get("exact"):
            problems += f"; latency run: {p['latency'].get('detail')}"
        return f"| {p['peer']} | **WRONG, not ranked**: {problems.strip('; ')} |" + " |" * 10
    m, lat = p["metrics"], p["latency"] or {}
    dedup = m.get("dedup_bytes_per_million")
    dedup_mb = "-" if p["peer"] == "raw" or dedup is None else f"{dedup / 1e6:,.0f}"
    return (f"| {p['peer']} | {_n(p['median_msg_per_s'])} | {_n(p['min_msg_per_s'])}"
            f"-{_n(p['max_msg_per_s'])} | {_share(p['ratio_to_raw'])} | "
            f"{_x(p['ratio_to_textbook'])} | {_n(lat.get('p50_ms'), '.1f')} / "
            f"{_n(lat.get('p99_ms'), '.1f')} | {_n(m.get('commits_per_msg'), '.2f')} | "
            f"{_n(m.get('wal_syncs_per_msg'), '.2f')} | "
            f"{_n(m.get('statements_per_msg'), '.1f')} | "
            f"{dedup_mb} | {_ms(m.get('cpu_s_per_1000'))} | {_ms(m.get('db_cpu_s_per_1000'))} |")


HEADER = ("| peer | msg/s median | min-max | of raw | x textbook | latency p50 / p99 ms | "
          "commits/msg | WAL syncs/msg | statements/msg | dedup MB per M msgs | "
          "CPU ms per 1k msgs | database CPU ms per 1k msgs |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def cell_section(cell: dict[str, Any]) -> str:
    s = cell["settings"]
    lat = cell.get("latency_pace")
    lines = [f"### {cell['name']}: {cell['title']}", "",
             f"{s['events']:,} messages ({s['dup_rate']:.0%} duplicates) over {s['keys']:,} "
             f"keys ({s['spread']}), handler cost `{s['cost']}`"
             + (f", dedup table pre-filled with {s['prefill']:,} ids" if s["prefill"] else "")
             + (", replay: the consumer restarts from offset 0" if s["replay"] else "")
             + f"; median of {s['runs']} runs."
             + (f" Latency: {lat['events']:,} events at {lat['rate']:g} msg/s, one key each."
                if lat else ""), "", HEADER]
    lines += [_peer_row(p) for p in cell["peers"]]
    return "\n".join(lines)


def cleanup_section(passes: list[dict[str, Any]]) -> str:
    lines = ["### cleanup: drop a day's partition vs DELETE the same rows, under load", "",
             "A consumerkit consumer consumes at a fixed pace while `maintain()` runs on its "
             "own connection: `drop` with the default partitioned layout (it drops the expired "
             "day's partition), `delete` with `DedupPolicy(layout=\"table\")` (it deletes "
             "the same rows in batches of 10,000; the VACUUM after it is timed apart). "
             "Latency p99 of events sent before it and while it ran (at least 1 s from its "
             "start).", "",
             "| pass | rows | seconds | VACUUM after s | p99 before ms | p99 during ms | "
             "events during | effects |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for p in passes:
        lines.append(
            f"| {p['method']} #{p['repeat']} | {p['rows']:,} | {_n(p['seconds'], '.4f')} | "
            f"{_n(p['vacuum_seconds'], '.3f')} | {_n(p['baseline']['p99_ms'], '.1f')} | "
            f"{_n(p['during']['p99_ms'], '.1f')} | {p['during']['events']} | "
            f"{'exact' if p['exact'] else 'WRONG: ' + p['detail']} |")
    return "\n".join(lines)


def relay_section(relay: dict[str, Any]) -> str:
    lines = ["### relay: consumerkit's outbox relay against faststream-outbox", "",
             f"{relay['rows']:,} events over {relay['aggregates']:,} aggregates written "
             f"beforehand, relayed by one process to a topic of {relay['partitions']} "
             f"partitions; from the COMMIT of the rows to an empty outbox table; median of "
             f"{relay['runs']} runs. Each run's topic read back: every event, on its "
             "aggregate's key, in per-aggregate order (first deliveries); duplicates counted.",
             "", "| relay | events/s median | min-max | x faststream-outbox | duplicates | "
             "effects |", "|---|---:|---:|---:|---:|---|"]
    base = next((p["median_events_per_s"] for p in relay["peers"]
                 if p["peer"] == "faststream-outbox"), None)
    for p in relay["peers"]:
        if p["unavailable"]:
            lines.append(f"| {p['peer']} | unavailable: {p['unavailable']} | | | | |")
            continue
        if not p["exact"]:
            problems = "; ".join(f"run {s['run']}: {s['detail']}" for s in p["samples"]
                                 if not s["exact"])
            lines.append(f"| {p['peer']} | **WRONG, not ranked**: {problems} | | | "
                         f"{p['duplicates']} | WRONG |")
            continue
        median = p["median_events_per_s"]
        lines.append(f"| {p['peer']} | {_n(median)} | {_n(p['min_events_per_s'])}-"
                     f"{_n(p['max_events_per_s'])} | "
                     f"{_x(median / base if base and median else None)} | {p['duplicates']} | "
                     f"exact |")
    return "\n".join(lines)


def acceptance_section(targets: list[dict[str, Any]]) -> str:
    lines = ["| target | met | measured |", "|---|---|---|"]
    for t in targets:
        met = {True: "yes", False: "**no**", None: "not measured", "figure": "(figure)"}[t["met"]]
        lines.append(f"| {t['target']} | {met} | {t['detail']} |")
    return "\n".join(lines)


def render(document: dict[str, Any]) -> str:
    on = " on Apache Kafka" if document.get("broker") == "kafka" else ""
    parts = [f"## Run {document['started']}{on} ({document['profile']} profile, "
             f"{document['seconds']:.0f} s)", "", "### Targets", "",
             acceptance_section(document["acceptance"]), ""]
    for cell in document["cells"]:
        parts += [cell_section(cell), ""]
    if document.get("cleanup"):
        parts += [cleanup_section(document["cleanup"]), ""]
    if document.get("relay"):
        parts += [relay_section(document["relay"]), ""]
    parts += ["### Context", ""]
    parts += [f"- {k}: {v}" for k, v in document["context"].items()]
    parts += ["", "### Peers", ""]
    described = {p["peer"]: p["description"] for c in document["cells"] for p in c["peers"]}
    for p in (document.get("relay") or {}).get("peers", []):
        described[f"relay {p['peer']}"] = p["description"]
    parts += [f"- `{name}`: {text}" for name, text in described.items()]
    return "\n".join(parts) + "\n"
