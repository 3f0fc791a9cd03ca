"""Log output for the command line: plain text for a terminal, or one JSON object per line.

Log records that concern a message carry its fields as record attributes (``extra=``, or
``ctx.log``'s adapter): :data:`MESSAGE_FIELDS`. The JSON formatter writes every one that is
present, so a log pipeline can filter on them without parsing messages.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Literal, TextIO

import orjson

LogFormat = Literal["text", "json"]

MESSAGE_FIELDS = ("event_id", "event_type", "key", "topic", "partition", "offset", "handler",
                  "attempt", "consumer", "events", "first_event_id", "last_event_id")
"""Record attributes written as JSON fields when present."""

_TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the message's fields and, for
    an exception, its type and traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in MESSAGE_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value if isinstance(value, int | float | str | bool) else str(value)
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
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    handler.addFilter(_PoolReconnects())
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
