"""The demo's output: a live progress view in a terminal (with ``rich``), plain lines otherwise
(in CI, or without ``rich``), and the closing table either way."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

from .report import Counts, Report

if TYPE_CHECKING:
    from rich.live import Live

PLAIN_EVERY = 2.0  # seconds between progress lines when not in a terminal


def _rich_available() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


class Progress:
    """``update(phase, counts)`` as the run goes; a context manager around the run."""

    def __init__(self, orders: int, fancy: bool | None = None) -> None:
        self.orders = orders
        self.fancy = (sys.stdout.isatty() and _rich_available()) if fancy is None else fancy
        self.phase = "starting"
        self.started = time.monotonic()
        self._live: Live | None = None
        self._printed = 0.0

    def __enter__(self) -> Progress:
        if self.fancy:
            from rich.live import Live

            self._live = Live(self._table(Counts()), refresh_per_second=8, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.__exit__(exc_type, exc, tb)
            self._live = None

    def note(self, text: str) -> None:
        """A line that stays: a phase change, a kill."""
        line = f"[{time.monotonic() - self.started:5.1f}s] {text}"
        if self._live is not None:
            self._live.console.print(line)
        else:
            print(line, flush=True)

    def update(self, counts: Counts, phase: str | None = None) -> None:
        if phase is not None and phase != self.phase:
            self.phase = phase
            self.note(phase)
        if self._live is not None:
            self._live.update(self._table(counts))
        elif time.monotonic() - self._printed >= PLAIN_EVERY:
            self._printed = time.monotonic()
            c = counts
            print(f"  orders {c.orders}/{self.orders}  published {c.published}/{c.written}  "
                  f"charges {c.charges}  reservations {c.reservations}  payments {c.payments}"
                  f"  duplicates absorbed {c.duplicates}", flush=True)

    def _table(self, c: Counts) -> Any:
        from rich.table import Table

        table = Table(title=f"pizza shop: {self.phase}", show_header=False, box=None)
        for name, value in [
            ("orders placed", f"{c.orders} / {self.orders}"),
            ("events published", f"{c.published} / {c.written}"),
            ("charges", c.charges), ("reservations", c.reservations),
            ("payments completed", c.payments), ("duplicates absorbed", c.duplicates),
            ("order violations", c.violations),
            ("time", f"{time.monotonic() - self.started:.1f}s"),
        ]:
            table.add_row(name, str(value))
        return table


def render(report: Report, fancy: bool) -> None:
    """The closing table: one line per figure, what it must be, and whether it is."""
    if fancy:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="pizza shop: every order once, in order")
        for column in ("", "figure", "must be", "ok"):
            table.add_column(column)
        for line in report.lines:
            table.add_row(line.name, str(line.value), line.expected,
                          "[green]yes[/green]" if line.ok else "[red]NO[/red]")
        Console().print(table)
    else:
        width = max(len(line.name) for line in report.lines)
        for line in report.lines:
            mark = "ok " if line.ok else "NO "
            print(f"{mark} {line.name:<{width}}  {line.value!s:<12} {line.expected}")
    print("every order charged, reserved and paid exactly once, in order" if report.ok
          else "MISMATCH: see the lines marked NO")
