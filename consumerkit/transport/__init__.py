"""Broker adapters. :mod:`consumerkit.transport.kafka` is the only module importing aiokafka;
:mod:`consumerkit.transport.memory` is the in-memory source for tests."""

from .kafka import KafkaProducer, KafkaSource
from .memory import MemoryBroker, MemorySource
from .source import Partition, RebalanceHandler, Source

__all__ = [
    "KafkaProducer",
    "KafkaSource",
    "MemoryBroker",
    "MemorySource",
    "Partition",
    "RebalanceHandler",
    "Source",
]
