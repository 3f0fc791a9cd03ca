"""DSNs: read as asyncpg reads them, or refused in words that hold no password; redacted
whatever characters the password holds."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from asyncpg import connect_utils
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from consumerkit.cli.errors import scrub
from consumerkit.engine.lifecycle import connect, open_pool
from consumerkit.shared.dsn import EXAMPLE, REASONS, DsnError, dsn_secrets, parse_dsn, redact_dsn

TEMPLATE = "postgresql://billing:{}@127.0.0.1:5432/billing"
REDACTED = TEMPLATE.format("***")

# any character a password may hold: printable, white space, control, non-ASCII
PASSWORDS = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1,
                    max_size=40)
SPECIAL = st.text(st.sampled_from("/#?@:% &=+\t'\"\\é€😀"), min_size=1, max_size=6)


def asyncpg_reads(dsn: str) -> tuple[list[Any], Any]:
    """What asyncpg makes of ``dsn``: its addresses and connection parameters."""
    return connect_utils._parse_connect_dsn_and_args(  # type: ignore[attr-defined,no-any-return]
        dsn=dsn, host=None, port=None, user=None, password=None, passfile=None,
        database=None, ssl=None, service=None, servicefile=None, direct_tls=None,
        server_settings=None, target_session_attrs=None, krbsrvname=None, gsslib=None)


@pytest.mark.parametrize("mark", ["/", "?", "#", "@"])
def test_a_raw_mark_in_the_password_is_refused_without_the_password(mark: str) -> None:
    dsn = TEMPLATE.format(f"Hunter2{mark}SECRETpw")
    assert redact_dsn(dsn) == REDACTED
    with pytest.raises(DsnError) as caught:
        parse_dsn(dsn)
    message = str(caught.value)
    assert message.startswith(f"malformed PostgreSQL DSN {REDACTED}: percent-encode")
    assert "Hunter2" not in message
    assert "SECRET" not in message


@pytest.mark.parametrize("encoded", ["Hunter2%2FSECRETpw", "Hunter2%2fSECRETpw",
                                     "Hunter2%3FSECRETpw", "Hunter2%23SECRETpw",
                                     "Hunter2%40SECRETpw", "Hunter2%25SECRETpw"])
def test_a_percent_encoded_password_is_read_and_redacted(encoded: str) -> None:
    dsn = TEMPLATE.format(encoded)
    parsed = parse_dsn(dsn)
    assert parsed.password == asyncpg_reads(dsn)[1].password
    assert parsed.password is not None
    assert parsed.password.startswith("Hunter2")
    for shown in (redact_dsn(dsn), repr(parsed), str(parsed)):
        assert shown == REDACTED
    assert scrub(f"quoting {dsn} and {parsed.password}", parsed.secrets()) == "quoting *** and ***"


@pytest.mark.parametrize(("dsn", "reason"), [
    ("postgresql://app:pw@127.0.0.1:abc/x", "port"),
    ("postgresql://app:pw@127.0.0.1:99999/x", "port"),
    ("postgresql://app:pw@[::1/x", "url"),
    ("postgresql://app:pw@h1,,h2/x", "host"),
    ("postgresql://app:pw@h/x?sslmode", "query"),
    ("postgresql://app:pw@h/x?port=5432x", "port"),
    ("postgresql://app:p\tw@h/x", "control"),
    ("postgresql://app:pw@h/x#frag", "fragment"),
    ("mysql://app:pw@h/x", "scheme"),
    ("host=h password=pw", "scheme"),
])
def test_what_asyncpg_would_refuse_or_misread_is_refused_in_fixed_words(
        dsn: str, reason: str) -> None:
    with pytest.raises(DsnError) as caught:
        parse_dsn(dsn)
    assert caught.value.reason == reason
    assert "pw" not in str(caught.value).replace("password", "")


def test_the_parts_are_read_as_asyncpg_reads_them() -> None:
    dsn = "postgres://b%40x:p%3Aw@h1:5433,[::1]:6000/data%20base?sslmode=disable&password=q"
    parsed = parse_dsn(dsn)
    addresses, params = asyncpg_reads(dsn)
    assert parsed.user == params.user == "b@x"
    assert parsed.password == params.password == "p:w"  # the user info's wins over the query
    assert parsed.database == params.database == "data base"
    assert [(h, p) for h, p in parsed.hosts] == [tuple(a) for a in addresses]
    assert redact_dsn(dsn) == ("postgres://b%40x:***@h1:5433,[::1]:6000/data%20base?"
                               "sslmode=disable&password=***")


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(PASSWORDS)
def test_any_password_round_trips_percent_encoded(password: str) -> None:
    dsn = TEMPLATE.format(quote(password, safe=""))
    parsed = parse_dsn(dsn)
    assert parsed.password == password
    assert asyncpg_reads(dsn)[1].password == password  # what the driver is handed
    assert redact_dsn(dsn) == REDACTED  # never the password, in any form
    assert password in parsed.secrets()


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(PASSWORDS | st.builds("{}{}{}".format, PASSWORDS, SPECIAL, PASSWORDS))
def test_any_raw_password_is_read_as_asyncpg_reads_it_or_refused_unquoted(
        password: str) -> None:
    dsn = TEMPLATE.format(password)
    assert redact_dsn(dsn) == REDACTED
    refused: DsnError | None = None
    try:
        parsed = parse_dsn(dsn)
    except DsnError as exc:
        refused = exc
    if refused is not None:  # in fixed words: no part of the password
        assert str(refused) == (f"malformed PostgreSQL DSN {REDACTED}: "
                                f"{REASONS[refused.reason]} (expected {EXAMPLE})")
        return
    addresses, params = asyncpg_reads(dsn)
    assert (parsed.user, parsed.password, parsed.database) == (
        params.user, params.password, params.database)
    assert list(parsed.hosts) == [tuple(a) for a in addresses]


@given(PASSWORDS)
def test_the_scrubbed_line_holds_no_password(password: str) -> None:
    assume(len(password.strip()) >= 3 and password not in "***")
    for dsn in (TEMPLATE.format(password), TEMPLATE.format(quote(password, safe="")),
                f"postgresql://h/db?sslmode=disable&password={quote(password, safe='')}"):
        line = scrub(f"refused {dsn}: bad password {password!s}", dsn_secrets(dsn))
        assert password not in line


async def test_a_consumer_refuses_the_dsn_before_asyncpg_can_quote_it() -> None:
    dsn = TEMPLATE.format("Hunter2?Zq9pw").replace("5432", "1")
    for opening in (lambda: open_pool(dsn, "c", 1), lambda: connect(dsn).__aenter__()):
        with pytest.raises(DsnError) as caught:
            await opening()
        assert "Hunter2" not in str(caught.value)
        assert "Zq9" not in str(caught.value)
