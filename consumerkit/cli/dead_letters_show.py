"""What ``consumerkit dead-letters show`` and ``replay --dry-run`` print.

Everything taken from the record is escaped (:func:`~consumerkit.display.displayable`): a
payload is shown line by line (JSON indented), so a newline in it cannot forge a line of the
output and an escape sequence cannot reach the terminal.
"""

from __future__ import annotations

import orjson

from ..consumer import Consumer
from ..deadletter.store import DeadLetterFilter, StoredDeadLetter
from ..display import displayable
from ..engine.dead_letters import preview_dead_letters
from .errors import database
from .try_handlers import trial, try_route

PAYLOAD_LIMIT = 64 * 1024
"""Characters of a payload shown at most (the rest is counted, not shown)."""


def show_entry(stored: StoredDeadLetter) -> str:
    e = stored.entry
    rows = [
        ("id", str(stored.id)), ("consumer", e.consumer),
        ("position", f"{e.topic}/{e.partition}/{e.offset}"),
        ("key", "(none)" if e.key is None else _text(e.key)),
        ("event id", e.event_id or "(none)"), ("event type", e.event_type or "(none)"),
        ("failed at", f"{e.failed_at:%Y-%m-%d %H:%M:%S %Z}"), ("reason", e.reason),
        ("detail", e.detail), ("attempts", str(e.attempts)), ("status", stored.status),
    ]
    if stored.resolved_at is not None:
        rows += [(stored.status, f"{stored.resolved_at:%Y-%m-%d %H:%M:%S %Z} by "
                                 f"{stored.resolved_by}"),
                 ("note", stored.resolution_note or "(none)")]
    if stored.replay_attempts:
        rows += [("replays", str(stored.replay_attempts)),
                 ("last replay error", stored.last_replay_error or "(none)")]
    lines = [f"{name}: {displayable(value, 2000)}" for name, value in rows]
    lines.append(f"headers: {len(e.headers)}")
    lines += [f"  {displayable(name, 200)}: "
              f"{'(null)' if value is None else displayable(_text(value), 2000)}"
              for name, value in e.headers]
    lines.append("payload:" if e.value is not None else "payload: (none)")
    lines += [f"  {displayable(line, PAYLOAD_LIMIT)}" for line in _payload(e.value)]
    return "\n".join(lines)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "backslashreplace")


def _payload(value: bytes | None) -> list[str]:
    if value is None:
        return []
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return _text(value[:PAYLOAD_LIMIT]).splitlines() or [""]
    return orjson.dumps(parsed, option=orjson.OPT_INDENT_2).decode()[:PAYLOAD_LIMIT].splitlines()


async def dry_run(consumer: Consumer, chosen: DeadLetterFilter, try_handlers: bool) -> int:
    """Decode each chosen entry (and, with ``try_handlers``, run its handler with its
    statements checked, never run); write nothing. Exit status 1 if any would fail."""
    previews = await preview_dead_letters(consumer, chosen)
    failing = 0
    async with database(consumer.postgres_dsn) as conn:
        for preview in previews:
            e = preview.entry.entry
            where = f"#{preview.entry.id} {displayable(e.topic)}/{e.partition}/{e.offset}"
            if preview.decoded is None:
                failing += 1
                print(f"{where}: would fail: {displayable(preview.error, 500)}")
                continue
            route = preview.decoded.route
            verdict, text = "decodes", ""
            if try_handlers:
                verdict, text = await try_route(consumer, conn, route,
                                                trial("the entry", preview.decoded))
            failing += verdict == "problem"
            print(f"{where}: {verdict}, handler {route.name}{displayable(text, 600)}")
    print(f"dry run: {len(previews)} dead letters, {len(previews) - failing} would be "
          f"replayed, {failing} would fail; nothing was written")
    return 1 if failing else 0
