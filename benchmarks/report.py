"""Samples, their summary per peer (median of runs with min and max), ratios and output."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Sample:
    """One peer, one run."""

    peer: str
    run: int
    messages: int
    seconds: float  # the measured window
    exact: bool
    detail: str
    metrics: dict[str, float | None] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


@dataclass(slots=True)
class Summary:
    peer: str
    description: str
    samples: list[Sample] = field(default_factory=list)
    unavailable: str | None = None  # why the peer did not run
    latency: dict[str, Any] | None = None  # from the paced run, if the cell had one

    @property
    def exact(self) -> bool:
        """Ranked only if every run (and the latency run, if any) was exact and every run
        measured a positive rate."""
        return (bool(self.samples) and all(s.exact and s.rate > 0 for s in self.samples)
                and (self.latency is None or bool(self.latency.get("exact"))))

    @property
    def rates(self) -> list[float]:
        return [s.rate for s in self.samples]

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    def metric(self, name: str) -> float | None:
        """The median of ``name`` over the runs that measured it."""
        values = [v for s in self.samples if (v := s.metrics.get(name)) is not None]
        return statistics.median(values) if values else None

    def problems(self) -> str:
        found = [f"run {s.run}: {s.detail}" for s in self.samples if not s.exact]
        if self.latency is not None and not self.latency.get("exact"):
            found.append(f"latency run: {self.latency.get('detail')}")
        return "; ".join(found)


def ratio(summary: Summary, base: Summary | None) -> float | None:
    """``summary``'s median over ``base``'s, when both are ranked."""
    if base is None or not base.exact or not summary.exact or base.median <= 0:
        return None
    return summary.median / base.median


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def table(summaries: list[Summary], raw: str = "raw", textbook: str = "textbook") -> str:
    """A Markdown table; a peer with a wrong result shows WRONG and gets no ratios."""
    by_name = {s.peer: s for s in summaries}
    lines = ["| peer | msg/s (median) | min | max | of raw | vs textbook | effects |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for s in summaries:
        if s.unavailable:
            lines.append(f"| {s.peer} | - | - | - | - | - | unavailable: {s.unavailable} |")
        elif s.exact:
            lines.append(
                f"| {s.peer} | {s.median:,.0f} | {min(s.rates):,.0f} | {max(s.rates):,.0f} | "
                f"{_share(ratio(s, by_name.get(raw)))} | "
                f"{_times(ratio(s, by_name.get(textbook)))} | exact |")
        else:
            lines.append(f"| {s.peer} | - | - | - | - | - | WRONG, not ranked: "
                         f"{s.problems() or 'no rate measured'} |")
    return "\n".join(lines)


def context_lines(context: dict[str, str]) -> str:
    return "\n".join(f"- {name}: {value}" for name, value in context.items())


def to_json(summaries: list[Summary], context: dict[str, str],
            settings: dict[str, Any]) -> dict[str, Any]:
    return {"context": context, "settings": settings, "peers": peers_json(summaries)}


def peers_json(summaries: list[Summary]) -> list[dict[str, Any]]:
    by_name = {s.peer: s for s in summaries}
    return [{
            "peer": s.peer, "description": s.description, "exact": s.exact,
            "unavailable": s.unavailable, "latency": s.latency,
            "metrics": {name: s.metric(name) for name in sorted(
                {k for x in s.samples for k in x.metrics})},
            "median_msg_per_s": s.median if s.exact else None,
            "min_msg_per_s": min(s.rates) if s.exact else None,
            "max_msg_per_s": max(s.rates) if s.exact else None,
            "ratio_to_raw": ratio(s, by_name.get("raw")),
            "ratio_to_textbook": ratio(s, by_name.get("textbook")),
            "samples": [{**asdict(x), "rate": x.rate} for x in s.samples],
        } for s in summaries]


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n")
