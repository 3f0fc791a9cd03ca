"""The targets a run is read against, judged from its own figures only.

1. consumerkit defaults >= 10x textbook in the main cell (1,000 keys, one upsert, 10 % dup.).
2. consumerkit with the Redis cache >= 1.5x consumerkit (PostgreSQL only) at 50 % duplicates.
4. consumerkit with metrics on (a Prometheus observer attached) within 5 % of metrics off in
   the main cell, in the same run: ``consumerkit-metrics >= 0.95x consumerkit``.
3. Dropping the expired day's partition >= 100x faster than deleting the same rows, and no
   visible p99 hit while it runs: p99 during the drop <= max(1.5 x p99 before, p99 before +
   5 ms), in every drop pass.

A target whose figures are missing (a peer unavailable or WRONG, a cell not in the profile)
is "not measured", never met.

Beside the targets, one figure is reported without a threshold (``met`` is ``"figure"``): the
Redis cache against PostgreSQL alone in the replay cell, where every message is a duplicate
the cache can know (a redelivery burst), to set beside target 2.
"""

from __future__ import annotations

import statistics
from typing import Any

from .profiles import MAIN, REDIS, REPLAY


def _median(cell: dict[str, Any] | None, peer: str) -> float | None:
    for p in (cell or {}).get("peers", []):
        if p["peer"] == peer and p["exact"]:
            return float(p["median_msg_per_s"])
    return None


def _cell(document: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((c for c in document["cells"] if c["name"] == name), None)


def _ratio(target: str, needed: float, top: float | None, bottom: float | None,
           what: str) -> dict[str, Any]:
    if top is None or bottom is None or bottom <= 0:
        return {"target": target, "met": None, "measured": None,
                "detail": f"not measured: {what} missing, unavailable or WRONG in this run"}
    ratio = top / bottom
    return {"target": target, "met": ratio >= needed, "measured": ratio,
            "detail": f"{top:,.0f} / {bottom:,.0f} msg/s = {ratio:.2f}x (needs {needed:g}x)"}


def _cleanup(passes: list[dict[str, Any]] | None) -> dict[str, Any]:
    target = "drop partition >= 100x faster than DELETE of the same rows, no visible p99 hit"
    drops = [p for p in passes or [] if p["method"] == "drop" and p["exact"]]
    deletes = [p for p in passes or [] if p["method"] == "delete" and p["exact"]]
    if not drops or not deletes:
        return {"target": target, "met": None, "measured": None,
                "detail": "not measured: no exact drop and delete passes"}
    drop = statistics.median(p["seconds"] for p in drops)
    delete = statistics.median(p["seconds"] for p in deletes)
    ratio = delete / drop if drop > 0 else float("inf")
    hits = []
    for p in drops:
        before, during = p["baseline"]["p99_ms"], p["during"]["p99_ms"]
        if before is None or during is None:
            hits.append("p99 not measured")
        elif during > max(1.5 * before, before + 5.0):
            hits.append(f"p99 {before:.1f} -> {during:.1f} ms")
    return {"target": target, "met": ratio >= 100 and not hits, "measured": ratio,
            "detail": f"DELETE {delete:.3f} s / drop {drop:.4f} s = {ratio:,.0f}x (needs 100x); "
                      + ("p99 hit during a drop: " + ", ".join(hits) if hits else
                         "no visible p99 hit during the drops")}


def _figure(what: str, top: float | None, bottom: float | None) -> dict[str, Any]:
    if top is None or bottom is None or bottom <= 0:
        return {"target": what, "met": "figure", "measured": None, "detail": "not measured"}
    ratio = top / bottom
    return {"target": what, "met": "figure", "measured": ratio,
            "detail": f"{top:,.0f} / {bottom:,.0f} msg/s = {ratio:.2f}x"}


def judge(document: dict[str, Any]) -> list[dict[str, Any]]:
    main, redis = _cell(document, MAIN), _cell(document, REDIS)
    replay = _cell(document, REPLAY)
    return [
        _ratio("consumerkit defaults >= 10x textbook (main cell)", 10.0,
               _median(main, "consumerkit"), _median(main, "textbook"),
               "consumerkit or textbook"),
        _ratio("consumerkit-redis >= 1.5x consumerkit at 50 % duplicates", 1.5,
               _median(redis, "consumerkit-redis"), _median(redis, "consumerkit"),
               "consumerkit-redis or consumerkit"),
        _cleanup(document.get("cleanup")),
        _ratio("consumerkit-metrics >= 0.95x consumerkit (metrics on vs off, main cell)", 0.95,
               _median(main, "consumerkit-metrics"), _median(main, "consumerkit"),
               "consumerkit-metrics or consumerkit"),
        _figure("consumerkit-redis / consumerkit in a replay burst (all duplicates)",
                _median(replay, "consumerkit-redis"), _median(replay, "consumerkit")),
    ]
