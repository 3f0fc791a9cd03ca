"""Untrusted text made safe to show on a terminal or in a text log line."""

from __future__ import annotations


def shown(text: str, limit: int = 200) -> str:
    """``text`` with control characters escaped, cut to ``limit`` characters."""
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                      for c in text)
    if len(escaped) <= limit:
        return escaped
    return f"{escaped[:limit]}... ({len(text)} characters)"
