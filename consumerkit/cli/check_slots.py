"""``consumerkit check``'s replication slot lines: a slot without a reader, or one keeping more
WAL than ``--max-slot-wal``, fills the database's disk (see docs/operations/runbooks.md,
"A replication slot keeping WAL")."""

from __future__ import annotations

import argparse
import re
from typing import Protocol

from ..errors import ConsumerKitError
from ..outbox.replication import DEFAULT_MAX_RETAINED, replication_slots, slot_problems
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
