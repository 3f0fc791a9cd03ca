"""The settings models: variables, ``.env``, flags and their precedence; Kafka TLS and SASL
passed through; what ``consumerkit run`` fills in a consumer and what it leaves alone."""

from __future__ import annotations

import argparse
import logging
import ssl
from pathlib import Path

import pytest

from consumerkit import Consumer
from consumerkit.cli.options import add_settings_arguments, load_settings, sources
from consumerkit.cli.run import apply_settings
from consumerkit.errors import ConfigurationError
from consumerkit.settings import ConsumerSettings, RelaySettings

from ..cli.app_consumer import charge

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def parse(model: type[ConsumerSettings] | type[RelaySettings], *argv: str,
          ) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, model)
    return parser.parse_args(list(argv))


def test_flag_beats_variable_beats_env_file_beats_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    env_file = tmp_path / "settings.env"
    env_file.write_text("CONSUMERKIT_MAX_BATCH=7\nCONSUMERKIT_CONCURRENCY=3\n"
                        "CONSUMERKIT_KAFKA_BOOTSTRAP=from-file:9092\n")
    monkeypatch.setenv("CONSUMERKIT_CONCURRENCY", "5")
    monkeypatch.setenv("CONSUMERKIT_KAFKA_BOOTSTRAP", "from-env:9092")
    monkeypatch.setenv("CONSUMERKIT_SCHEMA", "billing")
    monkeypatch.setenv("DB_SCHEMA", "not_this")  # only CONSUMERKIT_* variables count
    monkeypatch.setenv("MAX_BATCH", "1")
    args = parse(ConsumerSettings, "--kafka", "from-flag:9092", "--env-file", str(env_file))
    settings = load_settings(args, ConsumerSettings)
    assert isinstance(settings, ConsumerSettings)
    assert settings.kafka_bootstrap == "from-flag:9092"
    assert settings.concurrency == 5
    assert settings.max_batch == 7
    assert settings.db_schema == "billing"
    assert settings.handler_timeout == 60.0
    found = sources(args, ConsumerSettings)
    assert (found["kafka_bootstrap"], found["concurrency"], found["max_batch"],
            found["db_schema"], found["handler_timeout"]) == (
        "flag", "env", str(env_file), "env", "default")


def test_kafka_tls_and_sasl_options_pass_through() -> None:
    settings = ConsumerSettings(
        security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="billing", sasl_plain_password="s3cret",
        ssl_cafile=str(CA_BUNDLE) if CA_BUNDLE.exists() else None)
    options = settings.kafka_options()
    assert options["security_protocol"] == "SASL_SSL"
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "billing"
    assert options["sasl_plain_password"] == "s3cret"
    assert isinstance(options["ssl_context"], ssl.SSLContext)
    assert ConsumerSettings().kafka_options() == {}  # plaintext: nothing overrides the code


def test_run_fills_what_the_code_leaves_unset_and_keeps_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = Consumer(name="billing", handlers=[charge], topics=["orders"], max_batch=20,
                        kafka_options={"client_id": "billing-1"})
    settings = ConsumerSettings(
        postgres_dsn="postgresql://app:pw@db/app", kafka_bootstrap="k:9092",
        metrics_port=9100, max_batch=99, security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN", sasl_plain_username="u", sasl_plain_password="p")
    given = dict.fromkeys(ConsumerSettings.model_fields, "default")
    given.update(postgres_dsn="env", kafka_bootstrap="flag", metrics_port="env",
                 max_batch="env")
    with caplog.at_level(logging.WARNING, "consumerkit.cli"):
        origin = apply_settings(consumer, settings, given)
    assert consumer.postgres_dsn == "postgresql://app:pw@db/app"
    assert consumer.kafka_bootstrap == "k:9092"
    assert consumer.metrics_port == 9100
    assert consumer.max_batch == 20  # the code's value wins ...
    assert "--max-batch (env) ignored: the consumer's code passes max_batch=20" in caplog.text
    assert consumer.kafka_options["client_id"] == "billing-1"
    assert consumer.kafka_consumer_options["sasl_mechanism"] == "PLAIN"
    assert consumer.kafka_options["security_protocol"] == "SASL_PLAINTEXT"
    assert origin["postgres_dsn"] == "env"
    assert origin["max_batch"] == "code"


def test_a_value_the_code_configures_wins_as_a_passed_one_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = Consumer(name="billing", handlers=[charge], topics=["orders"])
    consumer.configure(max_batch=20)  # the code's choice, made after the constructor
    settings = ConsumerSettings(max_batch=99, db_schema="other")
    given = dict.fromkeys(ConsumerSettings.model_fields, "default")
    given.update(max_batch="env", db_schema="flag")
    with caplog.at_level(logging.WARNING, "consumerkit.cli"):
        origin = apply_settings(consumer, settings, given)
    assert (consumer.max_batch, origin["max_batch"]) == (20, "code")
    assert "--max-batch (env) ignored: the consumer's code passes max_batch=20" in caplog.text
    assert (consumer.schema, origin["db_schema"]) == ("other", "flag")
    assert "schema" not in consumer.given  # the setting's value is not the code's choice


async def test_a_consumer_without_services_names_the_setting() -> None:
    consumer = Consumer(name="billing", handlers=[charge], topics=["orders"])
    with pytest.raises(ConfigurationError, match="CONSUMERKIT_POSTGRES_DSN"):
        await consumer.run()
    consumer.postgres_dsn = "postgresql://app@db/app"
    with pytest.raises(ConfigurationError, match="CONSUMERKIT_KAFKA_BOOTSTRAP"):
        await consumer.run()
    with pytest.raises(ConfigurationError, match="CONSUMERKIT_POSTGRES_DSN"):
        await Consumer(name="b", handlers=[charge], topics=["orders"]).migrate()


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


def test_configure_derives_again_what_depends_on_the_values() -> None:
    """What ``consumerkit run`` changes is checked and derived as the constructor does it."""
    auto = Consumer(name="billing", handlers=[charge], topics=["orders"])
    assert auto.given == frozenset({"name", "handlers", "topics"})
    assert auto.concurrency == 4  # batches: a few at once
    auto.configure(max_batch=1, shutdown_timeout=0.5)
    assert (auto.max_batch, auto.concurrency) == (1, 16)  # one record each: more at once
    assert auto.revoke_timeout == 0.5
    chosen = Consumer(name="billing", handlers=[charge], topics=["orders"], concurrency=3)
    assert "concurrency" in chosen.given
    chosen.configure(max_batch=1)
    assert chosen.concurrency == 3  # the code's own choice is not derived
    for bad in ({"max_batch": 0}, {"shutdown_timeout": 0}, {"handler_timeout": -1.0},
                {"schema": "Bad-Name"}, {"name": "other"}, {"offset_store": "bogus"}):
        with pytest.raises(ConfigurationError):
            auto.configure(**bad)
        assert (auto.max_batch, auto.concurrency, auto.shutdown_timeout, auto.schema,
                auto.handler_timeout) == (1, 16, 0.5, "consumerkit", 60.0)  # all or nothing
