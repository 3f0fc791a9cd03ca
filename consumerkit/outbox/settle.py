"""What a relay writes back after a batch: the pure decision, given the sink's results."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..retry import RetryPolicy
from .event import OutboxEvent
from .sink import PermanentSendError
from .store import Failure


@dataclass(slots=True)
class Settlement:
    """Rows to delete (acknowledged, nothing earlier of their aggregate failed), failures to
    record (the first failure of each aggregate), and rows held back (acknowledged or not,
    after a failure of their aggregate: they go out again, in order, after it)."""

    delete: list[int] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    held: list[OutboxEvent] = field(default_factory=list)


def settle(events: Sequence[OutboxEvent], results: Sequence[BaseException | None],
           retry: RetryPolicy, rng: random.Random | None = None) -> Settlement:
    """Decide, in outbox order. After an aggregate's first failure its later events are
    neither deleted nor counted as failures: deleting an acknowledged later one would leave
    it published ahead of the failed one for good. A failure waits its back-off, or what the
    destination asked for (``retry_after``) if that is longer, capped at ``max_delay``."""
    if len(results) != len(events):
        raise ValueError(f"the sink reported {len(results)} results for {len(events)} events")
    out = Settlement()
    blocked: set[tuple[str, str]] = set()
    for event, result in zip(events, results, strict=True):
        aggregate = (event.aggregate_type, event.aggregate_id)
        if aggregate in blocked:
            out.held.append(event)
        elif result is None:
            out.delete.append(event.seq)
        else:
            blocked.add(aggregate)
            attempts = event.attempts + 1
            failed = isinstance(result, PermanentSendError) or attempts >= retry.max_attempts
            error = f"{type(result).__name__}: {result}"
            out.failures.append(Failure(event, error, _delay(result, attempts, retry, rng),
                                        failed))
    return out


def _delay(error: BaseException, attempts: int, retry: RetryPolicy,
           rng: random.Random | None) -> float:
    """The back-off, or longer if the destination asked for it (a ``retry_after`` in seconds,
    such as a webhook's ``Retry-After``), never beyond the policy's ``max_delay``."""
    delay = retry.delay(attempts, rng)
    asked = getattr(error, "retry_after", None)
    if isinstance(asked, int | float) and asked > delay:
        delay = min(float(asked), retry.max_delay)
    return delay
