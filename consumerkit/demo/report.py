"""What the demo counts, all read from the database, and the table it ends with.

Every figure comes from the run's tables, except deliveries and duplicates, which are the
consumers' own counters (reported to the ``workers`` table; a killed process's last moments
are missing from them, so those two lines are lower bounds).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..types import DbConnection

COUNTS = """SELECT
    (SELECT count(*) FROM {s}.orders) AS orders,
    (SELECT coalesce(sum(events), 0) FROM {s}.orders) AS order_events,
    (SELECT coalesce(sum(items), 0) FROM {s}.orders) AS units_ordered,
    (SELECT count(*) FROM {s}.injected) AS copies,
    (SELECT count(*) FROM {s}.shop_outbox) AS shop_pending,
    (SELECT count(*) FROM {s}.billing_outbox) AS billing_pending,
    (SELECT count(*) FROM {s}.charges) AS charges,
    (SELECT count(DISTINCT order_id) FROM {s}.charges) AS charged_orders,
    (SELECT count(*) FROM {s}.charges c JOIN {s}.orders o ON o.id = c.order_id
        WHERE c.amount <> o.total) AS wrong_charges,
    (SELECT count(*) FROM {s}.reservations) AS reservations,
    (SELECT count(DISTINCT order_id) FROM {s}.reservations) AS reserved_orders,
    (SELECT coalesce(sum(reserved), 0) FROM {s}.stock) AS units_reserved,
    (SELECT count(*) FROM {s}.orders WHERE paid_count > 0) AS payments,
    (SELECT count(*) FROM {s}.orders
        WHERE paid_count > 1 OR paid_amount <> total) AS wrong_payments,
    (SELECT count(*) FROM {s}.violations) AS violations,
    (SELECT count(*) FROM {s}.dead_letters) AS dead_letters,
    (SELECT count(*) FROM {s}.processed_events_ids) AS applied,
    (SELECT coalesce(sum(delivered), 0) FROM {s}.workers) AS deliveries,
    (SELECT coalesce(sum(duplicates), 0) FROM {s}.workers) AS duplicates
"""


@dataclass(frozen=True, slots=True)
class Counts:
    orders: int = 0
    order_events: int = 0
    units_ordered: int = 0
    copies: int = 0
    shop_pending: int = 0
    billing_pending: int = 0
    charges: int = 0
    charged_orders: int = 0
    wrong_charges: int = 0
    reservations: int = 0
    reserved_orders: int = 0
    units_reserved: int = 0
    payments: int = 0
    wrong_payments: int = 0
    violations: int = 0
    dead_letters: int = 0
    applied: int = 0
    deliveries: int = 0
    duplicates: int = 0

    @property
    def pending(self) -> int:
        return self.shop_pending + self.billing_pending

    @property
    def written(self) -> int:
        """Events written to the outboxes: the orders', the injected copies, the payments."""
        return self.order_events + self.copies + self.charges

    @property
    def published(self) -> int:
        return self.written - self.pending

    @property
    def expected_applied(self) -> int:
        """Billing and inventory apply every order event once, the shop every payment."""
        return 2 * self.order_events + self.charged_orders

    def done(self, orders: int) -> bool:
        """Everything the run should lead to is in the database."""
        return (self.orders == orders and self.pending == 0 and self.charges >= orders
                and self.reservations >= orders and self.payments >= orders
                and self.applied >= self.expected_applied
                and self.duplicates >= 2 * self.copies)


async def read_counts(conn: DbConnection, schema: str) -> Counts:
    row = await conn.fetchrow(COUNTS.format(s=schema))
    assert row is not None
    return Counts(**{k: int(v) for k, v in dict(row).items()})


@dataclass(frozen=True, slots=True)
class Kill:
    process: str
    pid: int
    at_seconds: float
    when: str  # what had happened when it was killed
    restarted_pid: int
    after: str = ""  # what the restart led to, when checked (a broker: back in the metadata)
    ok: bool = True


@dataclass(frozen=True, slots=True)
class Line:
    name: str
    value: int | float | str
    expected: str
    ok: bool


@dataclass(slots=True)
class Report:
    orders: int
    counts: Counts
    kills: list[Kill]
    seconds: float
    expected_kills: int = 2  # the billing consumer, the orders relay (and a Kafka broker)
    broker: str = ""
    producers: dict[str, int] | None = None  # on Kafka: idempotent producer ids per topic
    lines: list[Line] = field(default_factory=list)

    def __post_init__(self) -> None:
        c, n = self.counts, self.orders
        self.lines = [
            Line("orders placed", c.orders, f"= {n}", c.orders == n),
            Line("events published", c.published,
                 f"= {c.written} ({c.order_events} order events + {c.copies} injected copies"
                 f" + {c.charges} payments), none pending", c.pending == 0
                 and c.published == c.order_events + c.copies + n),
            Line("deliveries", c.deliveries, "> duplicates absorbed",
                 c.deliveries > c.duplicates),
            Line("duplicates absorbed", c.duplicates,
                 f">= {2 * c.copies} (each copy by billing and inventory)",
                 c.duplicates >= 2 * c.copies and c.copies > 0),
            Line("events applied", c.applied, f"= {c.expected_applied}, once each",
                 c.applied == c.expected_applied == 2 * c.order_events + n),
            Line("charges", c.charges, f"= {n} orders, each its total",
                 c.charges == c.charged_orders == n and c.wrong_charges == 0),
            Line("reservations", c.reservations,
                 f"= {n} orders ({c.units_ordered} units of stock)",
                 c.reservations == c.reserved_orders == n
                 and c.units_reserved == c.units_ordered),
            Line("payments completed", c.payments, f"= {n}, each paid once",
                 c.payments == n and c.wrong_payments == 0),
            Line("order violations", c.violations, "= 0 (each order's events in sequence)",
                 c.violations == 0),
            Line("dead letters", c.dead_letters, "= 0", c.dead_letters == 0),
            *(Line(f"kill {i}: {k.process}", f"pid {k.pid} SIGKILLed at {k.at_seconds:.1f}s",
                   f"{k.when}; restarted as pid {k.restarted_pid}"
                   + (f"; {k.after}" if k.after else ""), k.ok)
              for i, k in enumerate(self.kills, start=1)),
            Line("kills", len(self.kills), f"= {self.expected_kills}",
                 len(self.kills) == self.expected_kills),
            *([Line("broker", self.broker, "", True)] if self.broker else []),
            *([] if self.producers is None else [Line(
                "idempotent producers",
                ", ".join(f"{n} on {t}" for t, n in self.producers.items()) or "unknown",
                "> 0 on each topic (the relays' producer ids, from the partitions' leaders)",
                bool(self.producers) and all(n > 0 for n in self.producers.values()))]),
            Line("time", f"{self.seconds:.1f}s", "", True),
        ]

    @property
    def ok(self) -> bool:
        return all(line.ok for line in self.lines)

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "orders": self.orders, "seconds": round(self.seconds, 3),
                "broker": self.broker, "producers": self.producers,
                "counts": asdict(self.counts), "kills": [asdict(k) for k in self.kills],
                "lines": [asdict(line) for line in self.lines]}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")
