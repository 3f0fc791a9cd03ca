"""Untrusted text made fit to show: in a text log line, a dead-letter detail, a listing on a
terminal, an HTTP error body.

Event ids, event types, keys and error messages come from whoever produced the record (or from
the database quoting its values). Shown raw, a newline forges a log line or a listing row, and
an escape sequence retitles or clears the operator's terminal; a 10 KB value makes a 10 KB line.
:func:`displayable` escapes every character that can do that, visibly (``\\n``, ``\\x1b``,
``\\u202e``), and cuts long text, saying how long it was:

- C0 controls, DEL and C1 controls (``U+0000``-``U+001F``, ``U+007F``-``U+009F``);
- the Unicode line and paragraph separators (``U+2028``, ``U+2029``);
- the bidirectional marks, embeddings, overrides and isolates, which can make text read in
  another order than it is stored (``U+061C``, ``U+200E``, ``U+200F``, ``U+202A``-``U+202E``,
  ``U+2066``-``U+2069``);
- lone surrogates (from bytes decoded with ``surrogateescape``), which no UTF-8 stream can
  write.

Backslashes are left as they are: a literal ``\\n`` in the text forges nothing, and paths and
patterns stay readable. The result is stable: escaping it again changes nothing.
"""

from __future__ import annotations

import re

import asyncpg

DEFAULT_LIMIT = 500
"""Characters kept of a value shown in one line (before the note of its length)."""

_ESCAPED = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
    "\ud800-\udfff]")
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    short = _SHORT.get(char)
    if short is not None:
        return short
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escaped(text: str) -> str:
    """``text`` with every character listed in the module docstring escaped, nothing cut."""
    if text.isprintable():  # every character escaped here is one that is not printable
        return text
    return _ESCAPED.sub(_escape, text)


def displayable(text: object, limit: int = DEFAULT_LIMIT) -> str:
    """``text`` (or ``str(text)``) escaped and, when longer than ``limit`` characters, cut to
    at most ``limit`` with a note of its original length: ``abc… [10240 characters]``.

    The length noted is that of the escaped text; the result is never longer than ``limit``
    (unless ``limit`` is too small to hold the note), so showing it again keeps it as it is.
    """
    shown = escaped(text if isinstance(text, str) else str(text))
    if len(shown) <= limit:
        return shown
    note = f"… [{len(shown)} characters]"
    return shown[:max(0, limit - len(note))] + note


def cut(text: str, limit: int = DEFAULT_LIMIT) -> str:
    """``text`` cut as :func:`displayable` cuts it, but not escaped: for output that escapes
    by itself (JSON), where an escape would be shown doubled."""
    if len(text) <= limit:
        return text
    note = f"… [{len(text)} characters]"
    return text[:max(0, limit - len(note))] + note


DESCRIPTION_LIMIT = 2000

# asyncpg appends the server's DETAIL (and HINT) to an error's text on lines of their own; a
# handler that wraps such an error in its own carries them along, and a traceback shows them
# before the next exception of a chain
_DETAIL = re.compile(
    r"(?:\A|\n)DETAIL: .*?(?=\nHINT: |\n\n(?:The above exception|During handling)|\Z)",
    re.DOTALL)


def without_detail(text: str) -> str:
    """``text`` (an error's message, a traceback) without PostgreSQL's ``DETAIL`` lines, which
    quote the row's values: see :func:`describe`."""
    return _DETAIL.sub("", text) if "DETAIL: " in text else text


def describe(exc: BaseException) -> str:
    """``Type: message`` for logs, dead-letter details and webhook answers: escaped, at most
    :data:`DESCRIPTION_LIMIT` characters, and without a database error's ``DETAIL``.

    PostgreSQL's DETAIL quotes the row's values (``Key (email)=(ann@example.com) already
    exists``, ``Failing row contains (...)``): the payload's data, possibly personal, and
    text a producer chose. It is left out, as a line ``DETAIL:`` in any exception's text is;
    the message (which names the constraint) stays. To see the values, a handler can log
    ``exc.detail`` itself; a dead letter keeps the record's exact value, which holds them.
    """
    if isinstance(exc, asyncpg.PostgresError):
        text = str(exc.args[0]) if exc.args else ""
        hint = getattr(exc, "hint", None)
        if hint:
            text += f" (hint: {hint})"
    else:
        text = str(exc)
    return displayable(f"{type(exc).__name__}: {without_detail(text)}", DESCRIPTION_LIMIT)
