"""What the observer seam costs per message, metrics off and on, without a broker or a database.

Per message the pipeline calls ``delivered``, ``handler_finished`` (around two clock reads)
and one outcome (``applied``, or ``duplicate`` for one in ten). This times those calls on the
consumer's own observers, as built by a consumer without metrics and with a registry, so the
difference is the metrics' share; set it beside the consumer's CPU seconds per 1,000
messages in the benchmark tables. ``python -m benchmarks.observer_cost [--messages N]``
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from consumerkit.engine.observing import consumer_observer
from consumerkit.envelope import Envelope, Record
from consumerkit.stats import ConsumerStats

RECORD = Record("orders", 2, 41, b"o-1", b"{}", [("id", b"e-1")])
ENVELOPE = Envelope("e-1", "header", "order.placed", "o-1", "orders", 2, 41, None)


def per_message(registry: CollectorRegistry | None, messages: int) -> float:
    """Microseconds per message of the seam's calls (best of three passes)."""
    observer, _ = consumer_observer("bench", ConsumerStats(), (), registry)
    seen = datetime.now(UTC)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for i in range(messages):
            observer.delivered(1)
            began = time.perf_counter()
            observer.handler_finished("handler", time.perf_counter() - began)
            if i % 10:
                observer.applied(RECORD, ENVELOPE, "handler")
            else:
                observer.duplicate(RECORD, ENVELOPE, "handler", seen)
        best = min(best, (time.perf_counter() - started) / messages * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    args = parser.parse_args()
    off = per_message(None, args.messages)
    on = per_message(CollectorRegistry(), args.messages)
    print(f"metrics off: {off:.2f} us/msg; metrics on: {on:.2f} us/msg; "
          f"the metrics add {on - off:.2f} us/msg")


if __name__ == "__main__":
    main()
