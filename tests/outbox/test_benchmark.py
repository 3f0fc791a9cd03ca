"""Smoke test of the outbox benchmark with tiny sizes, on the test services."""

from __future__ import annotations

import argparse

from benchmarks.outbox import run


async def test_the_outbox_benchmark_runs_and_reports_every_figure(
    postgres_dsn: str, kafka_bootstrap: str,
) -> None:
    args = argparse.Namespace(rows=300, aggregates=20, rate=100, seconds=0.5, poll=0.05)
    lines = await run(postgres_dsn, kafka_bootstrap, args)
    assert [line.split(",")[0].split(" at ")[0] for line in lines] == [
        "throughput", "throughput", "latency", "latency", "cleanup"]
    assert all(" 0 events/s" not in line for line in lines)
    assert "(50 events)" in lines[2]
