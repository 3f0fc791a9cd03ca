"""Helpers for testing consumerkit, and code built on it, against real local services."""
