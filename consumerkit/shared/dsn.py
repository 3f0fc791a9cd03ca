"""Connection URLs (PostgreSQL DSNs, Redis URLs): parsed in one place, shown without secrets.

:func:`parse_dsn` reads a PostgreSQL DSN exactly as asyncpg does, and refuses, in a message
that holds no password, every DSN asyncpg would read otherwise than its author meant (a raw
``/``, ``?``, ``#`` or ``@`` in the password, which ends the user info early and sends the
password's tail on as the host, port, database or query) and every value asyncpg would
refuse in words that quote it (a port that is not a number, a query field without ``=``).

:func:`redact_dsn` shows any URL or libpq ``key=value`` string with its passwords as ``***``;
it never fails. Where a URL is ambiguous, everything up to its last ``@`` counts as user info:
hiding too much is harmless, too little is not. :func:`dsn_secrets` lists what output must
never contain, for the error lines that quote a library's words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlparse

from ..errors import ConfigurationError

EXAMPLE = "postgresql://user:password@host:5432/database"
_URL = re.compile(r"\s*[A-Za-z][A-Za-z0-9+.-]*://")
_KEYWORD_PASSWORD = re.compile(
    r"""(\w*password\s*=\s*)   # password=, sslpassword=, any case, spaces around '='
        ('(?:\\.?|[^'\\])*'?     # a quoted value (backslash escapes; unterminated: to the end)
        |(?:\\.?|[^\s\\])*)     # or an unquoted one, up to unescaped white space
    """,
    re.IGNORECASE | re.VERBOSE | re.DOTALL,
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PORT = re.compile(r"[0-9]{1,5}")
_IPV6 = re.compile(r"\[([^\]]+)\](?::(.*))?")
ENCODE = "percent-encode '/', '?', '#' and '@' in the user name and password (%2F %3F %23 %40)"
REASONS = {
    "scheme": "not a postgresql:// or postgres:// URL",
    "url": "not a valid URL",
    "control": "it holds a control character (tab, line break...): percent-encode it",
    "raw": ENCODE,
    "fragment": "a '#' ends the URL there: percent-encode it as %23",
    "host": "an empty host in the host list",
    "ipv6": "an IPv6 address is written [address] or [address]:port",
    "port": "a port must be a number from 0 to 65535",
    "query": "each query field is key=value, separated by '&'",
}
"""Every reason :func:`parse_dsn` gives: fixed words, never a part of the DSN."""


class DsnError(ConfigurationError):
    """A DSN that cannot be used as written; the message shows it redacted."""

    def __init__(self, dsn: str, reason: str) -> None:
        self.reason = reason
        super().__init__(f"malformed PostgreSQL DSN {redact_dsn(dsn)}: {REASONS[reason]} "
                         f"(expected {EXAMPLE})")


@dataclass(frozen=True, repr=False)
class Dsn:
    """A PostgreSQL DSN as asyncpg reads it. ``repr`` and ``str`` are the redacted text."""

    text: str
    user: str | None
    password: str | None = None
    hosts: tuple[tuple[str, int | None], ...] = ()
    database: str | None = None
    options: tuple[tuple[str, str], ...] = ()

    def redacted(self) -> str:
        return redact_dsn(self.text)

    def __repr__(self) -> str:
        return self.redacted()

    def __str__(self) -> str:
        return self.redacted()

    def secrets(self) -> list[str]:
        """What output must never show: the text whole, the password as written and decoded,
        every ``...password=`` option."""
        return dsn_secrets(self.text)


def parse_dsn(text: str) -> Dsn:
    """``text`` read as asyncpg reads it, or a :class:`DsnError` saying why it cannot be."""
    if not isinstance(text, str) or not _URL.match(text):
        raise DsnError(str(text), "scheme")
    if _CONTROL.search(text):  # urllib drops tabs and line breaks without a word
        raise DsnError(text, "control")
    try:
        parts = urlparse(text)
    except ValueError:  # its words quote the host and user info
        raise DsnError(text, "url") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise DsnError(text, "scheme")
    rest = parts.path + parts.params + parts.query + parts.fragment
    if "@" in rest or parts.netloc.count("@") > 1:
        raise DsnError(text, "raw")
    if "#" in text:  # asyncpg drops what follows
        raise DsnError(text, "fragment")
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":") if at else ("", "", "")
    try:
        options = tuple(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
                        ) if parts.query else ()
    except ValueError:
        raise DsnError(text, "query") from None
    for key, value in options:
        if key == "port" and value and not all(_is_port(p) for p in value.split(",")):
            raise DsnError(text, "port")
    database = parts.path.removeprefix("/")
    return Dsn(text=text, user=unquote(user) if user else None,
               password=unquote(password) if password else None,
               hosts=_hosts(text, hostlist), database=unquote(database) if database else None,
               options=options)


def _hosts(text: str, hostlist: str) -> tuple[tuple[str, int | None], ...]:
    if not hostlist:
        return ()
    hosts: list[tuple[str, int | None]] = []
    for spec in hostlist.split(","):
        if not spec:
            raise DsnError(text, "host")
        if spec.startswith("["):
            match = _IPV6.fullmatch(spec)
            if match is None:
                raise DsnError(text, "ipv6")
            host, port = match.group(1), match.group(2)
        else:
            host, colon, port = spec.partition(":")
            port = port if colon else None
        if port is not None and port != "" and not _is_port(port):
            raise DsnError(text, "port")
        hosts.append((unquote(host), int(port) if port else None))
    return tuple(hosts)


def _is_port(text: str) -> bool:
    return bool(_PORT.fullmatch(text)) and int(text) <= 65535


def _split(text: str) -> tuple[str, str | None, str] | None:
    """``(scheme://, user info or None, the rest)`` of a URL, the user info running to the
    last ``@``; None for what is not a URL."""
    match = _URL.match(text)
    if match is None:
        return None
    head, rest = text[:match.end()], text[match.end():]
    userinfo, at, after = rest.rpartition("@")
    return (head, userinfo, after) if at else (head, None, rest)


def redact_dsn(dsn: str) -> str:
    """A DSN or URL with every password replaced by ``***`` (for logs and error messages).

    Both libpq forms are covered: a URL (the password of the user info, whatever characters
    it holds, and ``password=`` or ``sslpassword=`` in the query, percent-encoded keys
    included since libpq decodes them) and ``key=value`` pairs (quoted or not, with libpq's
    backslash escapes). Any key ending in ``password`` counts, whatever its case.
    """
    parts = _split(dsn)
    if parts is None:
        return _KEYWORD_PASSWORD.sub(r"\1***", dsn)
    head, userinfo, rest = parts
    shown = ""
    if userinfo is not None:
        user, colon, _ = userinfo.partition(":")
        # an '@' past the host: the user info may hold a query, keep none of it
        mixed = any(c in user for c in "/?#&=")
        shown = "***@" if mixed else f"{user}:***@" if colon else f"{user}@"
    before, hash_, _fragment = rest.partition("#")
    address, question, query = before.partition("?")
    pairs = "&".join(_redact_pair(pair) for pair in query.split("&")) if question else ""
    return f"{head}{shown}{address}{question}{pairs}{'#***' if hash_ else ''}"


def _redact_pair(pair: str) -> str:
    key, sep, _value = pair.partition("=")
    if not sep:  # no key: a password's tail after a raw '&'
        return "***" if pair else pair
    if unquote(key).strip().lower().endswith("password"):
        return f"{key}=***"
    return pair


def dsn_secrets(dsn: str) -> list[str]:
    """What output must never show of ``dsn``: the text whole when it holds a password, and
    each password, as written and decoded (none: a DSN without a password is no secret)."""
    if redact_dsn(dsn) == dsn:
        return []
    found = [dsn, dsn.strip()]
    parts = _split(dsn)
    if parts is None:
        found += [m.group(2).strip("'") for m in _KEYWORD_PASSWORD.finditer(dsn)]
        return [s for s in found if s]
    _head, userinfo, rest = parts
    if userinfo is not None and ":" in userinfo:
        found.append(userinfo.partition(":")[2])
    _before, _, query = rest.partition("#")[0].partition("?")
    for pair in query.split("&"):
        key, sep, value = pair.partition("=")
        if not sep:  # a bare field: a password's tail after a raw '&'
            found.append(key)
        elif unquote(key).strip().lower().endswith("password"):
            found.append(value)
    found += [unquote(s) for s in found]
    found += [unquote(s.replace("+", " ")) for s in found]
    return list(dict.fromkeys(s for s in found if s))
