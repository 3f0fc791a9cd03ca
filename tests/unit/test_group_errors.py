"""A group given a bad value raises the project's :class:`ConfigurationError` in one line
naming the group, the field and what is wrong, and never prints a secret, however the group
is built; the settings (whose fields are groups) still name the flag and the variable."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from consumerkit import Kafka, Limits, Metrics, Postgres, Stall, Timeouts, Unhandled
from consumerkit.cli.options import add_settings_arguments, load_settings
from consumerkit.errors import ConfigurationError
from consumerkit.settings import ConsumerSettings
from consumerkit.settings.groups import GROUPS

SECRET = "hunter2-not-for-logs"
DSN = f"postgresql://app:{SECRET}@db.internal:5432/orders"

BAD: list[tuple[Callable[[], object], str]] = [
    (lambda: Postgres(schema="Bad-Name"), "Postgres.schema: invalid schema name 'Bad-Name': "
     "use 1-63 characters of a-z, 0-9 and _, starting with a letter or _"),
    (lambda: Postgres(pooler="statement"),  # type: ignore[arg-type]
     "Postgres.pooler must be 'none', 'session' or 'transaction', not 'statement'"),
    (lambda: Kafka(options=[1]),  # type: ignore[arg-type]
     "Kafka.options must be a valid dictionary"),
    (lambda: Kafka(security_protocol="TLS"),  # type: ignore[arg-type]
     "Kafka.security_protocol must be 'PLAINTEXT', 'SSL', 'SASL_PLAINTEXT' or 'SASL_SSL', "
     "not 'TLS'"),
    (lambda: Limits(max_batch=0), "Limits.max_batch must be at least 1, not 0"),
    (lambda: Timeouts(shutdown=-1), "Timeouts.shutdown must be greater than 0.0, not -1"),
    (lambda: Stall(max_delay=float("inf")), "Stall.max_delay must be a finite number, not inf"),
    (lambda: Metrics(port=70000), "Metrics.port must be at most 65535, not 70000"),
    (lambda: Unhandled(policy="drop"),  # type: ignore[arg-type]
     "Unhandled.policy must be 'dead_letter' or 'skip', not 'drop'"),
    (lambda: Limits(max_batchh=3),  # type: ignore[call-arg]
     "Limits has no field 'max_batchh' (its fields: concurrency, max_batch, max_in_flight, "
     "max_message_bytes)"),
    (lambda: Limits.model_validate({"max_in_flight": -5}),
     "Limits.max_in_flight must be at least 1, not -5"),
    (lambda: Timeouts(handler=5).model_copy(update={"shutdown": 0}),
     "Timeouts.shutdown must be greater than 0.0, not 0"),
]


@pytest.mark.parametrize(("build", "message"), BAD)
def test_a_bad_value_is_one_line_naming_the_group_and_field(
        build: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        build()
    assert str(raised.value) == message
    assert raised.value.__cause__ is None  # no ValidationError (and its input) chained
    assert raised.value.__suppress_context__


def test_every_group_refuses_a_bad_value() -> None:
    refused = {message.split(".")[0].split()[0] for _, message in BAD}
    assert refused == {group.__name__ for group in GROUPS.values()}


@pytest.mark.parametrize("build", [
    lambda: Postgres(dsn=[DSN]),  # type: ignore[arg-type]
    lambda: Postgres(listen_dsn={"dsn": DSN}),  # type: ignore[arg-type]
    lambda: Kafka(sasl_plain_password=[SECRET]),  # type: ignore[arg-type]
    # short enough to be shown whole
    lambda: Kafka(options=f"password={SECRET}"),  # type: ignore[arg-type]
    lambda: Postgres(dsn=None).model_copy(update={"dsn": [DSN]}),
])
def test_a_refused_secret_is_never_printed(build: Callable[[], object]) -> None:
    with pytest.raises(ConfigurationError) as raised:
        build()
    assert SECRET not in str(raised.value)
    assert "must be a valid" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_copy_keeps_the_fields_set_and_validates_the_update() -> None:
    copy = Limits(max_batch=3).model_copy(update={"concurrency": "2"})
    assert (copy.max_batch, copy.concurrency) == (3, 2)  # "2" validated into an int
    assert copy.model_fields_set == {"max_batch", "concurrency"}
    assert Limits().merged(Limits(max_batch=7)).model_fields_set == {"max_batch"}


def test_a_bad_setting_still_names_its_flag_and_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSUMERKIT_LIMITS_MAX_BATCH", "0")
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, ConsumerSettings)
    with pytest.raises(ConfigurationError) as raised:
        load_settings(parser.parse_args([]), ConsumerSettings)
    assert str(raised.value).startswith(
        "invalid setting --limits-max-batch / $CONSUMERKIT_LIMITS_MAX_BATCH: ")
