"""Dead letters: the entry, and the destinations that keep it (a table or a Kafka topic)."""

from .entry import DeadLetterEntry
from .table import DeadLetterTable, list_dead_letters
from .topic import DeadLetterTopic

__all__ = [
    "DeadLetterEntry",
    "DeadLetterTable",
    "DeadLetterTopic",
    "list_dead_letters",
]
