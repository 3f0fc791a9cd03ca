"""Log output for the command line: plain text for a terminal, or one JSON object per line.

Log records that concern a message carry its fields as record attributes (``extra=``, or
``ctx.log``'s adapter): :data:`MESSAGE_FIELDS`. The JSON formatter writes every one that is
present, so a log pipeline can filter on them without parsing messages.

Much of what is logged comes from the records themselves (event ids and types, keys, error
messages quoting them), so a text line shows it through
:func:`~consumerkit.display.displayable`: a newline or an escape sequence in a value
cannot forge a line or reach the terminal, and a long value is cut with its length noted. A
traceback keeps its lines, each indented, so none of them can pass for an entry of its own.
JSON escapes by itself; long values are cut there too. Neither shows PostgreSQL's ``DETAIL``
in a traceback (the row's values: see :func:`consumerkit.shared.failures.describe`).
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Literal, TextIO

import orjson

from .display import cut, displayable, escaped
from .shared.failures import without_detail

LogFormat = Literal["text", "json"]

MESSAGE_FIELDS = ("event_id", "event_type", "key", "topic", "partition", "offset", "handler",
                  "attempt", "consumer", "events", "first_event_id", "last_event_id")
"""Record attributes written as JSON fields when present."""

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
VALUE_LIMIT = 1000
"""Characters kept of one string argument of a log message (an event type, a detail)."""
MESSAGE_LIMIT = 4000
"""Characters kept of a whole message, once formatted."""
_TRACEBACK_LINE_LIMIT = 2000


def message(record: logging.LogRecord) -> str:
    """The record's message with each long string argument cut (and its length noted), the
    whole cut at :data:`MESSAGE_LIMIT`; not escaped. The record is left as it was, for other
    handlers."""
    args = record.args
    if isinstance(args, tuple) and any(isinstance(a, str) and len(a) > VALUE_LIMIT
                                       for a in args):
        args = tuple(cut(a, VALUE_LIMIT) if isinstance(a, str) else a for a in args)
    elif isinstance(args, dict) and any(isinstance(a, str) and len(a) > VALUE_LIMIT
                                        for a in args.values()):
        args = {k: cut(a, VALUE_LIMIT) if isinstance(a, str) else a for k, a in args.items()}
    text = str(record.msg)
    if args:
        text = text % args
    return cut(text, MESSAGE_LIMIT)


def field_value(value: object) -> object:
    """A message field as written to JSON: numbers and booleans as they are, the rest as
    (cut) text."""
    if isinstance(value, int | float | bool):
        return value
    return cut(value if isinstance(value, str) else str(value), VALUE_LIMIT)


def _traceback(formatter: logging.Formatter, exc_info: logging._SysExcInfoType) -> str:
    """The traceback without a database error's DETAIL (the row's values)."""
    return without_detail(logging.Formatter.formatException(formatter, exc_info))


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, one line per record whatever the message holds (see the
    module docstring); a traceback follows on indented lines."""

    def __init__(self) -> None:
        super().__init__(_TEXT)

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return _traceback(self, ei)

    def format(self, record: logging.LogRecord) -> str:
        line = _TEXT % {"asctime": self.formatTime(record, self.datefmt),
                        "levelname": record.levelname, "name": escaped(record.name),
                        "message": displayable(message(record), MESSAGE_LIMIT * 2)}
        extra: list[str] = []
        if record.exc_info and record.exc_info[0] is not None:
            extra.append(self.formatException(record.exc_info))
        if record.stack_info:
            extra.append(self.formatStack(record.stack_info))
        for text in extra:
            line += "".join("\n  " + displayable(part, _TRACEBACK_LINE_LIMIT)
                            for part in text.split("\n"))
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the message's fields and, for
    an exception, its type and traceback."""

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return _traceback(self, ei)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": message(record),
        }
        for name in MESSAGE_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = field_value(value)
        if record.exc_info and record.exc_info[0] is not None:
            entry["error"] = record.exc_info[0].__name__
            entry["traceback"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class _PoolReconnects(logging.Filter):
    """asyncpg's pool logs a traceback each time it fails to open a connection again while
    the server is away (a restart, a failover): the error in one line says all of it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "asyncpg.pool" and record.exc_info and record.exc_info[1]:
            error = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {error}"
            record.args = None
            record.exc_info = record.exc_text = None
        return True


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes, as logging's last resort
    does: a stream bound at configuration outlives a replaced one (a closed capture)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        pass


def configure_logging(fmt: LogFormat = "text", level: str | int = "INFO") -> None:
    """Send every log record to stderr in ``fmt``, replacing the root logger's handlers."""
    handler = _Stderr()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(_PoolReconnects())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
