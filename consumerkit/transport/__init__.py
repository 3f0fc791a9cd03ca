"""Broker adapters. :mod:`consumerkit.transport.kafka` is the only module importing aiokafka."""

from .kafka import KafkaProducer, KafkaSource, Partition, RebalanceHandler

__all__ = ["KafkaProducer", "KafkaSource", "Partition", "RebalanceHandler"]
