"""Helpers for testing consumerkit, and code built on it, against real local services.

- :class:`TestConsumer`: a team's handlers run by the real engine, pipeline and dedup store
  on a real PostgreSQL, fed from an in-memory broker (no Kafka needed).
- :mod:`consumerkit.testing.plugin`: pytest fixtures (``consumerkit_postgres_dsn``,
  ``consumerkit_schema``, ``consumerkit_kafka_bootstrap``, ...), loaded automatically.
- :mod:`consumerkit.testing.services`: start Tansu, PostgreSQL and Redis without Docker.
"""

from ..engine.pipeline import Outcome
from ..transport.memory import MemoryBroker, MemorySource
from .harness import FAST_RETRY, TestConsumer
from .observe import Settled

__all__ = ["FAST_RETRY", "MemoryBroker", "MemorySource", "Outcome", "Settled", "TestConsumer"]
