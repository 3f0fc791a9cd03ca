"""Benchmarks for consumerkit: peers measured in one run against the same services.

``python -m benchmarks.throughput --help``; see ``benchmarks/README.md``.
"""
