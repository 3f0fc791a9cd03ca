"""The metrics the alerts read raise no false alarm: a gauge that an alert compares with a
threshold is exported only once its value is known."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from consumerkit.observability.metrics import ConsumerMetrics

AHEAD = "consumerkit_dedup_partitions_ahead_seconds"


def test_partitions_ahead_is_exported_only_once_measured() -> None:
    registry = CollectorRegistry()
    metrics = ConsumerMetrics(registry, "billing")
    # the table layout has no partitions: a 0 would fire ConsumerKitDedupPartitionsMissing
    metrics.partitions_ahead(None)
    assert registry.get_sample_value(AHEAD, {"consumer": "billing"}) is None
    metrics.partitions_ahead(3 * 86400.0)
    assert registry.get_sample_value(AHEAD, {"consumer": "billing"}) == 3 * 86400.0
