"""Benchmarks for consumerkit: peers measured in one run against the same services.

``python -m benchmarks --help`` (the suite) or ``python -m benchmarks.throughput --help`` (one
workload); see ``benchmarks/README.md``.
"""
