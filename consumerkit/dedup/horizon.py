"""Does the dedup window outlast every redelivery? (invariant I9)

An event can come back long after its first delivery: a handler retried until its attempts
run out, a dead-lettered event replayed by an operator, a group reset to the beginning of its
topics. Its dedup row must still be there, or its time must mark it as expired so the
``expired`` policy decides, never a silent second effect. This module compares
``DedupPolicy.retention`` with those horizons and reports what it finds; the caller decides
whether to refuse to start (``level == "error"``) or to log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from ..retry import RetryPolicy
from ..transport.kafka_admin import describe_topic_configs
from .policy import DedupPolicy

FOREVER = timedelta.max
"""A topic retention of ``-1``: records are kept forever."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One result of the check: ``error`` (the window is too short for the consumer's own
    retries: refuse to start), ``warning`` (a redelivery path can outlast the window) or
    ``unknown`` (a horizon could not be read)."""

    level: Literal["error", "warning", "unknown"]
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.message}"


def retry_horizon(retry: RetryPolicy, handler_timeout: float | None = None) -> timedelta:
    """The longest time from an event's first attempt to its last: every back-off at its
    maximum, plus every attempt running for ``handler_timeout``."""
    waits = sum(min(retry.max_delay, retry.initial_delay * retry.multiplier ** (n - 1))
                for n in range(1, retry.max_attempts))
    runs = (handler_timeout or 0.0) * retry.max_attempts
    return timedelta(seconds=waits + runs)


def horizon_findings(
    policy: DedupPolicy, *, retry: RetryPolicy, topic_retention: Mapping[str, timedelta | None],
    handler_timeout: float | None = None, parked_for: timedelta | None = None,
) -> list[Finding]:
    """Compare ``policy.retention`` with the retries' horizon, how long dead letters may wait
    before they are replayed (``parked_for``) and each topic's retention (``None``: unknown;
    :data:`FOREVER`: kept forever)."""
    window = policy.retention
    findings: list[Finding] = []
    retries = retry_horizon(retry, handler_timeout)
    if retries >= window:
        findings.append(Finding("error", (
            f"the dedup retention ({_text(window)}) is not longer than the retries of one event "
            f"({_text(retries)}): an event still being retried would come back expired")))
    if parked_for is not None and parked_for >= window:
        findings.append(Finding("warning", (
            f"dead letters may wait {_text(parked_for)} before a replay, longer than the dedup "
            f"retention ({_text(window)}): a replayed event would be judged expired")))
    again = ("applied a second time" if policy.expired == "apply"
             else "dead-lettered as expired" if policy.expired == "dead_letter"
             else "skipped as expired")
    for topic, kept in sorted(topic_retention.items()):
        if kept is None:
            findings.append(Finding("unknown", (
                f"the retention of topic {topic} could not be read: make sure the dedup "
                f"retention ({_text(window)}) covers how far back its consumers may be reset")))
        elif kept > window:
            findings.append(Finding("warning", (
                f"topic {topic} keeps records "
                f"{'forever' if kept == FOREVER else 'for ' + _text(kept)}, longer than the "
                f"dedup retention ({_text(window)}): after a reset to its beginning, events "
                f"older than the window would be {again} (expired={policy.expired!r})")))
    return findings


async def redelivery_horizon_check(
    policy: DedupPolicy, *, topics: Sequence[str], kafka_bootstrap: str,
    retry: RetryPolicy | None = None, handler_timeout: float | None = None,
    parked_for: timedelta | None = None, kafka_options: Mapping[str, Any] | None = None,
    timeout: float = 10.0,
) -> list[Finding]:
    """Read the topics' ``retention.ms`` from the broker (a broker that cannot say gives
    ``unknown`` findings, never an error) and return :func:`horizon_findings`."""
    configs = await describe_topic_configs(
        kafka_bootstrap, topics, names=["retention.ms"], options=kafka_options, timeout=timeout)
    return horizon_findings(
        policy, retry=retry or RetryPolicy(), handler_timeout=handler_timeout,
        parked_for=parked_for,
        topic_retention={t: _retention(configs.get(t, {}).get("retention.ms")) for t in topics})


def _retention(value: str | None) -> timedelta | None:
    try:
        ms = int(value) if value is not None else None
    except ValueError:
        return None
    if ms is None:
        return None
    return FOREVER if ms < 0 else timedelta(milliseconds=ms)


def _text(span: timedelta) -> str:
    seconds = span.total_seconds()
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
