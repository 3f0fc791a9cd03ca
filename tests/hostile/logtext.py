"""The text log lines a test's code wrote, formatted by consumerkit's own text formatter (the
one ``consumerkit run --log-format text`` installs), and what every such line must satisfy."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from consumerkit.logs import configure_logging

from .strategies import LINE_LIMIT


def text_formatter() -> logging.Formatter:
    """The formatter ``configure_logging("text")`` installs, taken without keeping its
    handler (the root logger is left as it was)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("text", "DEBUG")
        formatter = root.handlers[0].formatter
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    assert formatter is not None
    return formatter


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(text_formatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextlib.contextmanager
def text_logs(*names: str) -> Iterator[list[str]]:
    """Every record the loggers ``names`` (and their children) emit meanwhile, as the text
    formatter writes it."""
    handler = _Lines()
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


def unsafe(text: str) -> str | None:
    """Why ``text`` could not be shown as one line of a log or a listing: a control or other
    non-printable character (a newline forges a line, an escape sequence drives the
    terminal), or a length past :data:`LINE_LIMIT`; ``None`` when it is safe."""
    if len(text) > LINE_LIMIT:
        return f"{len(text)} characters long"
    bad = next((ch for ch in text if not ch.isprintable()), None)
    return None if bad is None else f"holds {bad!r} at {text.index(bad)}"


def check_lines(lines: list[str]) -> None:
    """Each text log line is one safe line (which also rules out a traceback)."""
    for line in lines:
        why = unsafe(line)
        assert why is None, f"text log line {why}: {line[:300]!r}"
