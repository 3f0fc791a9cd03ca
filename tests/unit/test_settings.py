"""The settings models: variables, ``.env``, flags and their precedence; Kafka TLS and SASL
passed through; what ``consumerkit run`` gives a consumer and what it leaves alone."""

from __future__ import annotations

import argparse
import logging
import ssl
from pathlib import Path

import pytest

from consumerkit import Consumer, Kafka, Limits, Postgres, Timeouts
from consumerkit.cli.options import add_settings_arguments, load_settings, sources
from consumerkit.cli.run import apply_settings
from consumerkit.errors import ConfigurationError
from consumerkit.settings import ConsumerSettings, RelaySettings, settings_fields

from ..cli.app_consumer import charge

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def parse(model: type[ConsumerSettings] | type[RelaySettings], *argv: str,
          ) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, model)
    return parser.parse_args(list(argv))


def defaults(**found: str) -> dict[str, str]:
    """Every setting's source ``default``, but those of ``found`` (``limits__max_batch``)."""
    given = {name: "default" for name, _ in settings_fields(ConsumerSettings)}
    given.update({k.replace("__", "."): v for k, v in found.items()})
    return given


def test_flag_beats_variable_beats_env_file_beats_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    env_file = tmp_path / "settings.env"
    env_file.write_text("CONSUMERKIT_LIMITS_MAX_BATCH=7\nCONSUMERKIT_LIMITS_CONCURRENCY=3\n"
                        "CONSUMERKIT_KAFKA_BOOTSTRAP=from-file:9092\n")
    monkeypatch.setenv("CONSUMERKIT_LIMITS_CONCURRENCY", "5")
    monkeypatch.setenv("CONSUMERKIT_KAFKA_BOOTSTRAP", "from-env:9092")
    monkeypatch.setenv("CONSUMERKIT_POSTGRES_SCHEMA", "billing")
    monkeypatch.setenv("POSTGRES_SCHEMA", "not_this")  # only CONSUMERKIT_* variables count
    monkeypatch.setenv("MAX_BATCH", "1")
    args = parse(ConsumerSettings, "--kafka", "from-flag:9092", "--limits-max-in-flight", "9",
                 "--env-file", str(env_file))
    settings = load_settings(args, ConsumerSettings)
    assert isinstance(settings, ConsumerSettings)
    assert settings.kafka.bootstrap == "from-flag:9092"
    assert settings.limits.concurrency == 5
    assert settings.limits.max_batch == 7
    assert settings.limits.max_in_flight == 9  # a flag beside variables of its group
    assert settings.postgres.schema == "billing"
    assert settings.timeouts.handler == 60.0
    found = sources(args, ConsumerSettings)
    assert (found["kafka.bootstrap"], found["limits.concurrency"], found["limits.max_batch"],
            found["postgres.schema"], found["timeouts.handler"]) == (
        "flag", "env", str(env_file), "env", "default")


def test_every_setting_is_a_flag_and_a_variable_of_its_group() -> None:
    names = dict(settings_fields(ConsumerSettings))
    assert {"postgres.dsn", "limits.max_batch", "stall.after_keys", "unhandled.ignore",
            "timeouts.handler", "metrics.port", "kafka.ssl_password"} <= names.keys()
    args = parse(ConsumerSettings, "--postgres-dsn", "postgresql://a@db/a",
                 "--limits-max-batch", "3", "--unhandled-ignore", "a.*",
                 "--unhandled-ignore", "b.*", "--timeouts-handler", "2.5")
    settings = load_settings(args, ConsumerSettings)
    assert isinstance(settings, ConsumerSettings)
    assert settings.dsn() == "postgresql://a@db/a"
    assert (settings.limits.max_batch, settings.unhandled.ignore, settings.timeouts.handler) == (
        3, ("a.*", "b.*"), 2.5)
    with pytest.raises(ConfigurationError,
                       match=r"--limits-max-batch / \$CONSUMERKIT_LIMITS_MAX_BATCH"):
        load_settings(parse(ConsumerSettings, "--limits-max-batch", "0"), ConsumerSettings)


def test_kafka_tls_and_sasl_options_pass_through() -> None:
    kafka = Kafka(
        security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="billing", sasl_plain_password="s3cret",
        ssl_cafile=str(CA_BUNDLE) if CA_BUNDLE.exists() else None)
    options = kafka.client_options()
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "billing"
    assert options["sasl_plain_password"] == "s3cret"
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert Kafka().client_options() == {}  # plaintext: nothing overrides the code
    # the code's own options win over TLS and SASL fields
    assert Kafka(security_protocol="SSL", options={"security_protocol": "PLAINTEXT"},
                 ).client_options()["security_protocol"] == "PLAINTEXT"


def test_run_fills_what_the_code_leaves_unchosen_and_keeps_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = Consumer(name="billing", handlers=[charge], topics=["orders"],
                        limits=Limits(max_batch=20),
                        kafka=Kafka(options={"client_id": "billing-1"}))
    settings = ConsumerSettings(
        postgres={"dsn": "postgresql://app:pw@db/app"},
        kafka={"bootstrap": "k:9092", "security_protocol": "SASL_PLAINTEXT",
               "sasl_mechanism": "PLAIN", "sasl_plain_username": "u",
               "sasl_plain_password": "p"},
        metrics={"port": 9100}, limits={"max_batch": 99, "max_in_flight": 300})
    given = defaults(postgres__dsn="env", kafka__bootstrap="flag", metrics__port="env",
                     limits__max_batch="env", limits__max_in_flight="env")
    with caplog.at_level(logging.WARNING, "consumerkit.cli"):
        origin = apply_settings(consumer, settings, given)
    assert consumer.postgres_dsn == "postgresql://app:pw@db/app"
    assert consumer.kafka_bootstrap == "k:9092"
    assert consumer.metrics_port == 9100
    assert consumer.max_batch == 20  # the code's value wins ...
    assert consumer.max_in_flight == 300  # ... the group's other fields come from settings
    assert ("--limits-max-batch (env) ignored: the consumer's code gives limits.max_batch=20"
            in caplog.text)
    assert consumer.kafka_options["client_id"] == "billing-1"
    assert consumer.kafka_consumer_options["sasl_mechanism"] == "PLAIN"
    assert consumer.kafka_options["security_protocol"] == "SASL_PLAINTEXT"
    assert origin["postgres.dsn"] == "env"
    assert origin["limits.max_batch"] == "code"
    assert origin["limits.max_in_flight"] == "env"
    # applied again (config run after run), the code's choices are still the code's
    assert apply_settings(consumer, settings, given)["limits.max_batch"] == "code"
    assert apply_settings(consumer, settings, given)["limits.max_in_flight"] == "env"


def test_a_field_left_unset_by_the_code_is_the_settings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = Consumer(name="billing", handlers=[charge], topics=["orders"],
                        postgres=Postgres(dsn=None, pooler="session"),
                        timeouts=Timeouts(handler=None))
    settings = ConsumerSettings(postgres={"dsn": "postgresql://a@db/a", "schema": "other"},
                                timeouts={"handler": 5.0})
    given = defaults(postgres__dsn="env", postgres__schema="flag", timeouts__handler="env")
    with caplog.at_level(logging.WARNING, "consumerkit.cli"):
        origin = apply_settings(consumer, settings, given)
    assert (consumer.postgres_dsn, origin["postgres.dsn"]) == ("postgresql://a@db/a", "env")
    assert (consumer.schema, origin["postgres.schema"]) == ("other", "flag")
    assert (consumer.postgres_pooler, origin["postgres.pooler"]) == ("session", "code")
    # None given where the default is not None is a choice: no limit
    assert (consumer.handler_timeout, origin["timeouts.handler"]) == (None, "code")
    assert "timeouts.handler=unset" in caplog.text


async def test_a_consumer_without_services_names_the_setting() -> None:
    consumer = Consumer(name="billing", handlers=[charge], topics=["orders"])
    with pytest.raises(ConfigurationError, match="CONSUMERKIT_POSTGRES_DSN"):
        await consumer.run()
    consumer.set_options(postgres=Postgres(dsn="postgresql://app@db/app"))
    with pytest.raises(ConfigurationError, match="CONSUMERKIT_KAFKA_BOOTSTRAP"):
        await consumer.run()


def test_relay_headers_from_flags() -> None:
    args = parse(RelaySettings, "--webhook-url", "https://example.com/hook",
                 "--webhook-header", "Authorization: Bearer x", "--no-notify")
    settings = load_settings(args, RelaySettings)
    assert isinstance(settings, RelaySettings)
    assert settings.webhook_headers["Authorization"].get_secret_value() == "Bearer x"
    assert settings.notify is False
    bad = parse(RelaySettings, "--webhook-header", "no colon")
    with pytest.raises(ConfigurationError, match="write 'Name: value'"):
        load_settings(bad, RelaySettings)


def test_set_options_derives_again_what_depends_on_the_values() -> None:
    """What ``consumerkit run`` changes is checked and derived as the constructor does it."""
    auto = Consumer(name="billing", handlers=[charge], topics=["orders"])
    assert auto.concurrency == 4  # batches: a few at once
    auto.set_options(limits=Limits(max_batch=1), timeouts=Timeouts(shutdown=0.5))
    assert (auto.max_batch, auto.concurrency) == (1, 16)  # one record each: more at once
    assert auto.revoke_timeout == 0.5
    chosen = Consumer(name="billing", handlers=[charge], topics=["orders"],
                      limits=Limits(concurrency=3, max_batch=1))
    assert chosen.concurrency == 3  # the code's own choice is not derived
    for bad in ({"offset_store": "bogus"}, {"limits": Timeouts()}, {"name": "other"}):
        with pytest.raises(ConfigurationError):
            auto.set_options(**bad)
        assert (auto.max_batch, auto.concurrency, auto.shutdown_timeout, auto.schema,
                auto.handler_timeout) == (1, 16, 0.5, "consumerkit", 60.0)  # all or nothing
    for field, value in (("max_batch", 0), ("concurrency", -1), ("max_in_flight", 10**9)):
        with pytest.raises(ConfigurationError, match=rf"Limits\.{field} must be"):
            Limits(**{field: value})
    with pytest.raises(ConfigurationError, match=r"Postgres\.schema: invalid schema name"):
        Postgres(schema="Bad-Name")
    with pytest.raises(ConfigurationError, match=r"Timeouts\.shutdown must be a finite"):
        Timeouts(shutdown=float("inf"))
    # a misspelt field is refused
    with pytest.raises(ConfigurationError, match="Limits has no field 'max_batchh'"):
        Limits(max_batchh=3)  # type: ignore[call-arg]


def test_a_variable_that_only_shares_a_groups_prefix_is_no_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``CONSUMERKIT_KAFKA_CACHE`` (the test harness's) is none of ``kafka``'s fields: ignored
    as any unknown ``CONSUMERKIT_*`` variable is, not refused by the group."""
    monkeypatch.setenv("CONSUMERKIT_KAFKA_CACHE", str(tmp_path))
    env_file = tmp_path / "settings.env"
    env_file.write_text("CONSUMERKIT_LIMITS_SOMETHING=1\nCONSUMERKIT_LIMITS_MAX_BATCH=4\n")
    settings = load_settings(parse(ConsumerSettings, "--env-file", str(env_file)),
                             ConsumerSettings)
    assert isinstance(settings, ConsumerSettings)
    assert (settings.kafka, settings.limits.max_batch) == (Kafka(), 4)
