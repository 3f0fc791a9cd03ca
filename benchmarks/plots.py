"""PNG plots of a suite run (matplotlib, Agg backend): msg/s per peer and cell with min-max
bars (WRONG and unavailable peers shown as such, never as a bar), latency per peer, and the
consumer's latency over time around each cleanup pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(document: dict[str, Any], out: Path, stem: str) -> list[Path]:
    """Write the plots next to the JSON; returns their paths (none without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    for cell in document["cells"]:
        paths.append(_throughput(plt, cell, out / f"{stem}-{cell['name']}.png"))
        if any(p["latency"] for p in cell["peers"]):
            paths.append(_latency(plt, cell, out / f"{stem}-{cell['name']}-latency.png"))
    if document.get("cleanup"):
        paths.append(_cleanup(plt, document["cleanup"], out / f"{stem}-cleanup.png"))
    return paths


def _throughput(plt: Any, cell: dict[str, Any], path: Path) -> Path:
    peers = cell["peers"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(peers) + 1.4))
    for i, p in enumerate(peers):
        if p["exact"]:
            med = p["median_msg_per_s"]
            ax.barh(i, med, color="tab:blue" if "consumerkit" in p["peer"] else "tab:gray")
            ax.errorbar(med, i, xerr=[[med - p["min_msg_per_s"]], [p["max_msg_per_s"] - med]],
                        color="black", capsize=3)
            ax.text(p["max_msg_per_s"] * 1.15, i, f"{med:,.0f}", va="center", fontsize=8)
        else:
            label = "unavailable" if p["unavailable"] else "WRONG (not ranked)"
            ax.text(1, i, label, va="center", fontsize=8, color="tab:red")
    ax.set_yticks(range(len(peers)), [p["peer"] for p in peers])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlim(left=1)
    ax.set_xlabel("msg/s (median of runs, min-max bars; log scale)")
    ax.set_title(f"{cell['name']}: {cell['title']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _latency(plt: Any, cell: dict[str, Any], path: Path) -> Path:
    peers = [p for p in cell["peers"] if p["latency"] and p["exact"]]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(peers) + 1.4))
    for i, p in enumerate(peers):
        lat = p["latency"]
        ax.barh(i - 0.2, lat["p50_ms"], height=0.4, color="tab:blue", label="p50" if not i
                else None)
        ax.barh(i + 0.2, lat["p99_ms"], height=0.4, color="tab:orange", label="p99" if not i
                else None)
    ax.set_yticks(range(len(peers)), [p["peer"] for p in peers])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency, ms (send to effect; log scale)")
    ax.set_title(f"{cell['name']}: latency at a fixed offered load", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cleanup(plt: Any, passes: list[dict[str, Any]], path: Path) -> Path:
    fig, axes = plt.subplots(len(passes), 1, figsize=(8, 2.0 * len(passes) + 0.6),
                             sharex=True, squeeze=False)
    for ax, p in zip(axes[:, 0], passes, strict=True):
        xs = [x for x, _ in p["points"]]
        ys = [y for _, y in p["points"]]
        ax.plot(xs, ys, ".", markersize=2)
        ax.axvspan(0, max(p["seconds"] or 0.0, 0.01), color="tab:red", alpha=0.3)
        ax.set_ylabel("ms")
        ax.set_title(f"{p['method']} #{p['repeat']}: {p['rows']:,} rows in "
                     f"{p['seconds'] or 0:.3f} s (red band)", fontsize=9)
    axes[-1, 0].set_xlabel("send time relative to the cleanup's start, s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
