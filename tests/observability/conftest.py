"""The end-to-end tests' ledger topic, for the observability tests too."""

from ..integration.conftest import ledger_topic

__all__ = ["ledger_topic"]
