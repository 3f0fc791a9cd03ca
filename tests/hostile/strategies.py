"""Hypothesis strategies for hostile input, and the settings profile of the suite.

Every strategy mixes the well-formed with what an attacker or a broken producer sends: control
characters and escape sequences, a line that imitates a log entry, invalid UTF-8, text far
longer than any limit, numbers beyond every integer type, versions written every wrong way.

The profile is derandomized, with no example database: CI sees the same examples on every run
(a failure reproduces from its test id alone, and the run time is steady on a loaded machine).
Breadth comes from the strategies themselves; set ``CONSUMERKIT_HOSTILE_DEEP=1`` to explore
with random seeds and ten times the examples.
"""

from __future__ import annotations

import json
import os
import string

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

settings.register_profile(
    "hostile", deadline=None, derandomize=True, database=None, print_blob=True,
    # the services are fixtures shared by every example: that is the point, not a mistake
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)
settings.register_profile("hostile-deep", settings.get_profile("hostile"), derandomize=False)
DEEP = os.environ.get("CONSUMERKIT_HOSTILE_DEEP") == "1"
PROFILE = settings.get_profile("hostile-deep" if DEEP else "hostile")


def examples(count: int) -> settings:
    """The suite's profile with ``count`` examples (ten times as many when exploring)."""
    return settings(PROFILE, max_examples=count * 10 if DEEP else count)


LINE_LIMIT = 4096
"""Longest text log line, response body or dead-letter detail the suite accepts: a long value
must be cut (with its length) where it is shown, not copied whole."""

FORGED_LINE = "\n2026-11-29 00:00:00,000 CRITICAL consumerkit.fake: INJECTED"
ESCAPES = ("\x1b]0;PWNED\x07\x1b[2J", "\r\x1b[1A", "\x00", "\u2028", "\u202e", "\x7f", "\x85")

_specials = st.sampled_from([FORGED_LINE, *ESCAPES, "\n", "\r\n", "\t", "'", '"', "\\",
                             "%s", "%(message)s", "{}", "\ufeff"])
_printable = st.text(st.characters(codec="utf-8"), max_size=20)

hostile_text = st.one_of(
    _printable,
    st.lists(st.one_of(_printable, _specials), min_size=1, max_size=6).map("".join),
    # far longer than any limit, with a forged line at the end of it
    st.tuples(st.sampled_from("xé€"), st.integers(3_000, 12_000), _specials)
    .map(lambda t: t[0] * t[1] + t[2]),
)
"""Text (valid UTF-8 once encoded) that tries to break a log line, a terminal or a limit."""

hostile_bytes = st.one_of(
    hostile_text.map(str.encode),
    st.binary(max_size=40),  # mostly invalid UTF-8
    st.sampled_from([b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b""]),
)
"""A header value or key: hostile text, or bytes that are not UTF-8 at all."""

versions = st.one_of(
    st.integers(-3, 4).map(lambda n: str(n).encode()),
    st.integers().map(lambda n: str(n).encode()),
    st.sampled_from([b"abc", b" 2 ", b"+2", b"2.0", b"1e3", b"0x2", b"1_0", "\u0663".encode(),
                     b"2\x00", b"", b"\xff", b"99999999999999999999999"]),
    hostile_bytes,
)
"""An event version header: good ones, and every way to write a bad one."""

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False), hostile_text,
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=12,
)


def dumps(value: object) -> bytes:
    """JSON of ``value``, integers of any size included (orjson stops at 64 bits)."""
    return json.dumps(value, ensure_ascii=False).encode()


def _deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


raw_values = st.one_of(
    json_values.map(dumps),
    st.binary(max_size=64),
    st.sampled_from([b"", b"{", b"null", b'"', b'"{\\"a\\": 1}"', b'{"schema": {"type": 1}}',
                     b'{"schema": {"type": "x"}, "payload": "\\u0000"}', b"\xef\xbb\xbf{}",
                     b'{"a": 1e999999}', b"[" * 20_000]),
    st.integers(100, 50_000).map(_deep),
)
"""A record value or request body: any JSON document, or bytes that are none."""

event_ids = st.one_of(
    st.text(string.ascii_letters + string.digits + "-", min_size=1, max_size=40),
    hostile_text,
)

header_names = st.one_of(
    st.sampled_from(["id", "event_type", "event_version", "occurred_at", "aggregate_type",
                     "correlation_id", "causation_id", "traceparent", "headers", "ID",
                     "Event_Type"]),
    st.text(st.characters(codec="utf-8"), max_size=12),
)
