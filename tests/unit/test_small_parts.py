import random
from datetime import timedelta

import pytest

from consumerkit import ConfigurationError, DedupPolicy, RetryPolicy
from consumerkit.errors import DeadLetter, Retry, is_retriable
from consumerkit.shared.identifiers import check_name, identifier, qualified, redact_dsn


def test_backoff_grows_with_jitter_and_is_capped() -> None:
    policy = RetryPolicy(max_attempts=6, initial_delay=0.1, max_delay=1.0, multiplier=2)
    rng = random.Random(1)
    for attempt, base in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        delays = [policy.delay(attempt, rng) for _ in range(50)]
        assert all(base / 2 <= d <= base for d in delays)
        assert len(set(delays)) > 1  # jittered


def test_bad_retry_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ConfigurationError):
        RetryPolicy(initial_delay=5, max_delay=1)


@pytest.mark.parametrize("name", ["Bad", "1abc", "a-b", 'x"; drop table y; --', "", "a" * 64])
def test_identifiers_are_validated(name: str) -> None:
    with pytest.raises(ConfigurationError):
        identifier(name)


def test_identifiers_are_quoted() -> None:
    assert identifier("processed_events") == '"processed_events"'
    assert qualified("consumerkit", "dead_letters") == '"consumerkit"."dead_letters"'


def test_names_are_validated() -> None:
    assert check_name("billing.v2_x-1", "consumer name") == "billing.v2_x-1"
    with pytest.raises(ConfigurationError):
        check_name("bad name", "consumer name")


def test_passwords_never_appear_in_redacted_dsns() -> None:
    assert redact_dsn("postgresql://bob:s3cret@db:5432/app") == "postgresql://bob:***@db:5432/app"
    assert "s3cret" not in redact_dsn("postgresql://db/app?user=bob&password=s3cret&x=1")
    assert redact_dsn("postgresql://bob@db/app") == "postgresql://bob@db/app"


def test_dedup_policy_validation() -> None:
    DedupPolicy(partition_interval=timedelta(hours=6), retention=timedelta(days=2))
    DedupPolicy(clock_skew=timedelta(0), claim_lock_timeout=timedelta(milliseconds=1))
    for bad in (
        {"partition_interval": timedelta(hours=5)},
        {"partition_interval": timedelta(minutes=30)},
        {"partition_interval": timedelta(days=1, hours=2)},
        {"retention": timedelta(hours=1)},
        {"table": "Bad-Name"},
        {"premake": 0},
        {"clock_skew": timedelta(seconds=-1)},
        {"claim_lock_timeout": timedelta(0)},
        {"claim_lock_timeout": timedelta(microseconds=999)},
    ):
        with pytest.raises(ConfigurationError):
            DedupPolicy(**bad)


def test_signals_and_retriability() -> None:
    assert is_retriable(RuntimeError())
    assert not is_retriable(DeadLetter("bad"))
    assert Retry(delay=0.5).delay == 0.5

    class Permanent(Exception):
        retriable = False

    assert not is_retriable(Permanent())


@pytest.mark.parametrize(("dsn", "expected"), [
    # key=value (libpq "conninfo"), with the quoting and escapes libpq accepts
    ("host=db password=S3CRET dbname=x", "host=db password=*** dbname=x"),
    ("host=db password='S3 CRET' dbname=x", "host=db password=*** dbname=x"),
    (r"host=db password='it\'s S3CRET' dbname=x", "host=db password=*** dbname=x"),
    (r"host=db password=S3\ CRET dbname=x", "host=db password=*** dbname=x"),
    ("host=db password = S3CRET dbname=x", "host=db password = *** dbname=x"),
    ("host=db\tPASSWORD=S3CRET\nuser=bob", "host=db\tPASSWORD=***\nuser=bob"),
    ("sslpassword=S3CRET host=db", "sslpassword=*** host=db"),
    ("host=db password='S3CRET unterminated", "host=db password=***"),
    ("host=db password=", "host=db password=***"),
    ("host=/tmp port=5432 user=bob", "host=/tmp port=5432 user=bob"),
    # URLs: user info and query parameters, percent-encoded keys included
    ("postgresql://bob:S3CRET@db:5432/app", "postgresql://bob:***@db:5432/app"),
    ("postgresql://bob:S3@CRET@h1:5432,h2/app", "postgresql://bob:***@h1:5432,h2/app"),
    ("postgresql://db/app?user=bob&password=S3CRET&x=1",
     "postgresql://db/app?user=bob&password=***&x=1"),
    ("postgres://db/app?Password=S3CRET", "postgres://db/app?Password=***"),
    ("postgresql://db/app?sslpassword=S3CRET&pass%77ord=S3CRET",
     "postgresql://db/app?sslpassword=***&pass%77ord=***"),
    ("postgresql://bob@db/app?sslmode=require", "postgresql://bob@db/app?sslmode=require"),
])
def test_passwords_are_redacted_in_every_dsn_form(dsn: str, expected: str) -> None:
    redacted = redact_dsn(dsn)
    assert redacted == expected
    assert "S3" not in redacted
    assert "CRET" not in redacted
