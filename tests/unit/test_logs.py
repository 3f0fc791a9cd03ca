"""JSON log lines: one object per line, with a message's fields when the record has them."""

from __future__ import annotations

import io
import logging
import sys

import orjson
import pytest

from consumerkit.logs import JsonFormatter, configure_logging


def _line(record: logging.LogRecord) -> dict[str, object]:
    parsed = orjson.loads(JsonFormatter().format(record))
    assert isinstance(parsed, dict)
    return parsed


def test_a_message_record_carries_its_fields() -> None:
    record = logging.makeLogRecord({
        "name": "consumerkit.pipeline", "levelname": "WARNING", "msg": "dead-lettered %s",
        "args": ("e-1",), "event_id": "e-1", "event_type": "order.created", "key": b"k",
        "topic": "orders", "partition": 2, "offset": 17, "handler": "charge", "attempt": 3})
    line = _line(record)
    assert line["message"] == "dead-lettered e-1"
    assert line["level"] == "WARNING"
    assert line["logger"] == "consumerkit.pipeline"
    assert str(line["time"]).endswith("+00:00")
    assert {k: line[k] for k in ("event_id", "event_type", "topic", "partition", "offset",
                                 "handler", "attempt")} == {
        "event_id": "e-1", "event_type": "order.created", "topic": "orders", "partition": 2,
        "offset": 17, "handler": "charge", "attempt": 3}
    assert line["key"] == "b'k'"


def test_an_exception_is_one_line_with_its_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.makeLogRecord({"msg": "failed", "exc_info": sys.exc_info()})
    text = JsonFormatter().format(record)
    assert "\n" not in text
    line = orjson.loads(text)
    assert line["error"] == "ValueError"
    assert "boom" in line["traceback"]


def test_configure_logging_replaces_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    try:
        configure_logging("json", "debug")
        logging.getLogger("consumerkit.test").debug("hello %d", 1)
        assert orjson.loads(stream.getvalue())["message"] == "hello 1"
        assert root.level == logging.DEBUG
    finally:
        root.handlers[:] = saved
        root.setLevel(level)


def test_the_pools_reconnect_failures_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncpg's pool logs a traceback for every failed reconnection during an outage; the
    command's log keeps the error, in one line. Other loggers keep their tracebacks."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    try:
        configure_logging("text", "info")
        for name in ("asyncpg.pool", "consumerkit.test"):
            try:
                raise ConnectionRefusedError(111, "Connection refused")
            except OSError:
                logging.getLogger(name).warning("Failed to restore; retrying", exc_info=True)
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
    pool, other = stream.getvalue().split("\n", 1)
    assert pool.endswith("asyncpg.pool: Failed to restore; retrying: "
                         "ConnectionRefusedError: [Errno 111] Connection refused")
    assert "Traceback (most recent call last)" in other


def test_records_go_to_the_stderr_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stderr replaced after configuration (a capture closed, a redirect) gets the records;
    the stream of the time is never written to again."""
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(root, "level", root.level)
    configure_logging("text")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("consumerkit.test").warning("after the swap")
    assert second.getvalue().endswith("WARNING consumerkit.test: after the swap\n")
    assert "Logging error" not in second.getvalue()
