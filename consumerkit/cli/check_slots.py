"""``consumerkit check``'s replication slot lines: a slot without a reader, or one keeping more
WAL than ``--max-slot-wal``, fills the database's disk (see docs/operations/runbooks.md,
"A replication slot keeping WAL"); an outbox read by change data capture without a slot
reading it loses the events written before its connector first starts."""

from __future__ import annotations

import argparse
import re
from typing import Protocol

from ..errors import ConsumerKitError
from ..outbox.cdc import slot_reading
from ..outbox.replication import DEFAULT_MAX_RETAINED, replication_slots, slot_problems
from ..outbox.table import OutboxTable
from .errors import database

_SIZE = re.compile(r"(\d+)\s*([KMGT]i?B|B)?", re.IGNORECASE)
_FACTORS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
            "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


class Reporter(Protocol):
    """The part of check's report this module writes to."""

    def ok(self, text: str) -> None: ...

    def problem(self, text: str) -> None: ...


def wal_size(text: str) -> int:
    """``512MiB``, ``1GiB``, ``2GB``, or plain bytes, as a number of bytes."""
    found = _SIZE.fullmatch(text.strip())
    if found is None:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: use e.g. 512MiB, 1GiB, 2GB")
    return int(found.group(1)) * _FACTORS[(found.group(2) or "").lower()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--outbox-cdc", action="store_true",
                        help="the --outbox-table tables are read by a connector (Debezium): "
                        "report one that no replication slot reads")
    parser.add_argument("--max-slot-wal", type=wal_size, default=DEFAULT_MAX_RETAINED,
                        metavar="SIZE", help="report a replication slot keeping more WAL than "
                        "this (default: 1GiB)")


async def check_slots(dsn: str | None, max_retained: int, report: Reporter) -> None:
    """A problem per slot that is inactive or keeps more than ``max_retained`` bytes of WAL.
    Says nothing when the database cannot be reached: the PostgreSQL check reported it."""
    try:
        async with database(dsn) as conn:
            slots = await replication_slots(conn)
    except ConsumerKitError:
        return
    problems = slot_problems(slots, max_retained)
    for problem in problems:
        report.problem(problem)
    if slots and not problems:
        report.ok(f"replication slots read and within the WAL limit: "
                  f"{', '.join(s.name for s in slots)}")


async def check_cdc_outboxes(dsn: str | None, tables: list[OutboxTable],
                             report: Reporter) -> None:
    """A problem per outbox read by change data capture that no replication slot reads."""
    if not tables:
        return
    try:
        async with database(dsn) as conn:
            found = [(t, await slot_reading(conn, t)) for t in tables]
    except ConsumerKitError:
        return
    for t, slot in found:
        name = f"{t.schema}.{t.table}"
        if slot is not None:
            report.ok(f"outbox {name} is read by replication slot {slot}")
            continue
        report.problem(f"no replication slot reads outbox {name} (change data capture): "
                       "events written before its connector first starts are lost; run "
                       "`consumerkit migrate --outbox-only --outbox-cdc --schema "
                       f"{t.schema} --outbox-table {t.table}` and give the connector "
                       f"slot.name={t.replication_slot}")
