"""The table of docs/operations/metrics.md names every metric family the code registers, with
its type and labels, and nothing else."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from consumerkit.observability.metrics import _FAMILIES, ConsumerMetrics, RelayMetrics
from consumerkit.observability.tally import TALLIED

from .conftest import OPERATIONS


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    """``{family: (type, labels)}`` from the table."""
    text = (OPERATIONS / "metrics.md").read_text()
    section = text[text.index("\n## Families\n"):]
    section = section[:section.find("\n## ", 1)]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| `")]
    return {row[0].strip("`"): (row[1], tuple(label.strip(" `") for label in row[2].split(",")))
            for row in rows}


def registered() -> dict[str, tuple[str, tuple[str, ...]]]:
    """``{family: (type, labels)}`` as a consumer and a relay register them; counters under the
    name they are exposed with (``_total``)."""
    registry = CollectorRegistry()
    ConsumerMetrics(registry, "billing")
    RelayMetrics(registry, "consumerkit.outbox", "relay")
    families = {}
    for name, metric in _FAMILIES[registry].items():
        kind = metric._type
        families[f"{name}_total" if kind == "counter" else name] = (
            kind, tuple(metric._labelnames))
    for spec in TALLIED:  # kept as integers, built at scrape time
        families[f"{spec.name}_total" if spec.kind == "counter" else spec.name] = (
            spec.kind, spec.labels)
    return families


def test_the_metrics_table_matches_the_registered_families() -> None:
    code = registered()
    assert "consumerkit_messages_total" in code  # the contract's names
    assert documented() == code
