"""Settings of the runnables, read from ``CONSUMERKIT_*`` variables, a ``.env`` file and flags.

One model per runnable: :class:`ConsumerSettings` (``consumerkit run``) and
:class:`RelaySettings` (``consumerkit relay``). Field names are the keyword arguments of
:class:`~consumerkit.Consumer` and :class:`~consumerkit.outbox.Relay`, except ``db_schema``
(``schema``: the name would shadow pydantic's own attribute); the variable is the name in
upper case after ``CONSUMERKIT_``. Precedence, highest first: a flag, a variable, the
``.env`` file, the default. DSNs and passwords are :class:`~pydantic.SecretStr`: their
``repr`` and ``str`` are ``**********``. The configuration reference in the docs is generated
from these models (``python -m consumerkit.settings.reference``).
"""

from __future__ import annotations

import json
import ssl
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from ..shared.dsn import dsn_secrets
from ..shared.identifiers import identifier
from ..shared.pooler import Pooler

PREFIX = "CONSUMERKIT_"
COUNT_MAX = 1_000_000
"""The most records or rows a count setting (batch, concurrency, stall) may name."""
IN_FLIGHT_MAX = 10_000_000
"""The most records fetched and not yet committed."""
SECONDS_MAX = 86_400.0
"""The longest timeout or delay, in seconds (a day): a larger one is a typo, and infinity or
NaN would reach asyncio's timers."""


class CommonSettings(BaseSettings):
    """What every runnable needs: the services, metrics, logs, Kafka security."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_file=".env", extra="ignore", populate_by_name=True,
        validate_default=True)

    postgres_dsn: SecretStr | None = Field(
        None, description="PostgreSQL DSN (`postgresql://user:password@host:5432/db`); "
        "never printed with its password")
    postgres_pooler: Pooler = Field(
        "none", description="what stands in front of PostgreSQL: `none` (a direct "
        "connection), `session` or `transaction` (PgBouncer's `pool_mode`); `transaction` "
        "turns the statement cache off and keeps no session state: the relay leases its "
        "slots in a table and polls")
    kafka_bootstrap: str | None = Field(
        None, description="Kafka bootstrap servers, `HOST:PORT[,HOST:PORT...]`")
    db_schema: str = Field(
        "consumerkit", validation_alias=AliasChoices(f"{PREFIX}SCHEMA"),
        description="the PostgreSQL schema of consumerkit's tables")
    metrics_port: int | None = Field(
        None, ge=0, le=65535,
        description="serve `/metrics`, `/healthz` and `/readyz` on this port (unset: no server)")
    metrics_host: str = Field("0.0.0.0", description="the address the metrics server binds")  # noqa: S104
    log_format: Literal["text", "json"] = Field(
        "text", description="`text` for a terminal, `json` for one object per line")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="the lowest level logged")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka: how clients talk to the brokers")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="Kafka: the SASL mechanism")
    sasl_plain_username: str | None = Field(None, description="Kafka: the SASL user name")
    sasl_plain_password: SecretStr | None = Field(None, description="Kafka: the SASL password")
    ssl_cafile: str | None = Field(
        None, description="Kafka TLS: the CA bundle that signs the brokers' certificates")
    ssl_certfile: str | None = Field(
        None, description="Kafka TLS: the client certificate (mutual TLS)")
    ssl_keyfile: str | None = Field(None, description="Kafka TLS: the client key")
    ssl_password: SecretStr | None = Field(None, description="Kafka TLS: the client key's password")
    uvloop: bool = Field(
        True, description="run on uvloop when it is installed (the `fast` extra); false: the "
        "standard asyncio loop")
    gc_tuning: bool = Field(
        True, description="once started, freeze the start-up objects and collect the young "
        "generation every 50,000 allocations instead of 700 (see operations); false: "
        "CPython's defaults")

    @field_validator("db_schema")
    @classmethod
    def _schema(cls, value: str) -> str:
        identifier(value, "schema name")
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    def secret_values(self) -> list[str]:
        """Every secret in clear, the DSN whole and its password: what output must never
        show, whatever the source (flag, variable, ``.env``)."""
        values = [s.get_secret_value() for s in (self.sasl_plain_password, self.ssl_password)
                  if s is not None]
        # a DSN without a password is no secret: the errors show it as they show any other
        # (user, host, port, database)
        return values + dsn_secrets(self.dsn() or "")

    def dsn(self) -> str | None:
        """The DSN in clear, for the database driver only."""
        return self.postgres_dsn.get_secret_value() if self.postgres_dsn else None

    def kafka_options(self) -> dict[str, Any]:
        """aiokafka options for TLS and SASL (only those that differ from aiokafka's
        defaults, so they never override what the code passes)."""
        options: dict[str, Any] = {}
        if self.security_protocol != "PLAINTEXT":
            options["security_protocol"] = self.security_protocol
        if self.sasl_mechanism is not None:
            options["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_plain_username is not None:
            options["sasl_plain_username"] = self.sasl_plain_username
        if self.sasl_plain_password is not None:
            options["sasl_plain_password"] = self.sasl_plain_password.get_secret_value()
        if "SSL" in self.security_protocol or self.ssl_cafile or self.ssl_certfile:
            options["ssl_context"] = self._ssl_context()
        return options

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        if self.ssl_certfile:
            password = self.ssl_password.get_secret_value() if self.ssl_password else None
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password)
        return context


class ConsumerSettings(CommonSettings):
    """``consumerkit run``: fills what the consumer's code leaves unset (``None``): the DSN,
    the bootstrap servers, the metrics port, TLS and SASL options. The other fields are for
    code that builds its consumer from them: ``Consumer(..., **settings.consumer_kwargs())``.
    """

    concurrency: int | None = Field(
        None, ge=1, le=COUNT_MAX,
        description="records (or batches) handled at once; unset: 4 with batches, 16 without")
    max_batch: int = Field(
        500, ge=1, le=COUNT_MAX, description="records per transaction (1: one each)")
    max_in_flight: int = Field(
        5000, ge=1, le=IN_FLIGHT_MAX, description="records fetched but not yet committed")
    handler_timeout: float | None = Field(
        60.0, gt=0, le=SECONDS_MAX, allow_inf_nan=False,
        description="seconds one handler call may take (unset: no limit)")
    shutdown_timeout: float = Field(
        30.0, gt=0, le=SECONDS_MAX, allow_inf_nan=False,
        description="seconds a graceful stop waits for in-flight work")
    stall_after_keys: int = Field(
        5, ge=0, le=COUNT_MAX,
        description="stall the consumer when a handler fails with the same error type "
        "for this many keys in a row (0: only a missing table, column or schema, a "
        "missing privilege or a read-only database stall it)")
    stall_max_delay: float = Field(
        30.0, gt=0, le=SECONDS_MAX, allow_inf_nan=False,
        description="the longest wait, in seconds, between two tries while stalled")
    offset_store: Literal["kafka", "postgres"] = Field(
        "postgres", description="where each partition's next offset is kept: `postgres` "
        "also stores it in the effects' transactions and trusts it on assignment; `kafka` "
        "only on the broker")
    unhandled: Literal["dead_letter", "skip"] = Field(
        "dead_letter", description="what becomes of a record whose event type no handler "
        "takes: `dead_letter` (nothing is lost without a word: a misspelt handler's events "
        "wait in the dead letters) or `skip` (counted per event type, logged once per type, "
        "the offset moves on; for a topic shared by many event types)")
    ignore: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="event types skipped even with "
        "`unhandled=dead_letter`, as fnmatch patterns (`order.internal.*`); several "
        "separated by commas or spaces, or a JSON list in the variable")

    @field_validator("ignore", mode="before")
    @classmethod
    def _patterns(cls, value: object) -> object:
        # an event type holds no comma or space, so either separates patterns
        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else [text]
        if isinstance(value, list):
            return [p for item in value for p in str(item).replace(",", " ").split()]
        return value

    def consumer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`~consumerkit.Consumer`."""
        return {
            "postgres_dsn": self.dsn(), "kafka_bootstrap": self.kafka_bootstrap,
            "schema": self.db_schema, "concurrency": self.concurrency,
            "max_batch": self.max_batch, "max_in_flight": self.max_in_flight,
            "handler_timeout": self.handler_timeout, "shutdown_timeout": self.shutdown_timeout,
            "stall_after_keys": self.stall_after_keys, "stall_max_delay": self.stall_max_delay,
            "kafka_options": self.kafka_options(), "metrics_port": self.metrics_port,
            "metrics_host": self.metrics_host, "offset_store": self.offset_store,
            "unhandled": self.unhandled, "ignore": list(self.ignore),
            "postgres_pooler": self.postgres_pooler,
        }


class RelaySettings(CommonSettings):
    """``consumerkit relay``: one outbox published to Kafka, or to a webhook when
    ``webhook_url`` is set."""

    table: str = Field("outbox", description="the outbox table")
    route: str = Field(
        "{aggregate_type}", description="Kafka topic template; `{event_type}` and "
        "`{aggregate_type}` are replaced by the event's values")
    batch_size: int = Field(
        500, ge=1, le=COUNT_MAX, description="rows claimed and sent per round")
    poll_interval: float = Field(
        1.0, gt=0, le=SECONDS_MAX, allow_inf_nan=False,
        description="seconds between polls when no notification comes")
    notify: bool = Field(True, description="wake on LISTEN/NOTIFY (off behind a pooler)")
    postgres_listen_dsn: SecretStr | None = Field(
        None, description="with `postgres_pooler` `transaction`: a DSN reaching PostgreSQL "
        "directly, on which the relay LISTENs to be woken by commits (unset: it polls); "
        "never printed with its password")
    name: str | None = Field(None, description="the relay's name in logs (unset: host:pid)")
    enable_idempotence: bool = Field(
        True, description="Kafka's idempotent producer (off for brokers without it)")
    auto_create_topics: bool = Field(
        False, description="let the broker create a topic the route names on first use "
        "(off: a missing topic is an error naming it, and its events wait until it exists)")
    webhook_url: str | None = Field(
        None, description="post each event to this URL instead of publishing it to Kafka")
    webhook_headers: dict[str, SecretStr] = Field(
        default_factory=dict, description="headers added to every webhook request (a JSON "
        "object in the variable; never printed)")
    webhook_secrets: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="Standard Webhooks secrets (`whsec_...`) that sign "
        "every webhook request, one signature each (rotation); several separated by spaces "
        "or a JSON list in the variable; never printed")
    webhook_timeout: float = Field(
        10.0, gt=0, le=SECONDS_MAX, allow_inf_nan=False,
        description="seconds one webhook delivery may take")

    @field_validator("webhook_secrets", mode="before")
    @classmethod
    def _secrets(cls, value: object) -> object:
        # whsec_ secrets hold no space, so a plain list separated by spaces is unambiguous
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else text.split()
        return value

    def secret_values(self) -> list[str]:
        """Every secret in clear (DSN password aside): what output must never show."""
        return [*super().secret_values(),
                *(v.get_secret_value() for v in self.webhook_headers.values()),
                *(v.get_secret_value() for v in self.webhook_secrets)]


SETTINGS: dict[str, type[CommonSettings]] = {"run": ConsumerSettings, "relay": RelaySettings}
"""The settings model of each runnable command."""


FLAGS = {"postgres_dsn": "--postgres", "kafka_bootstrap": "--kafka", "db_schema": "--schema",
         "postgres_listen_dsn": "--postgres-listen",
         "webhook_headers": "--webhook-header", "webhook_secrets": "--webhook-secret"}


def flag(name: str) -> str:
    """The command-line flag of field ``name``."""
    return FLAGS.get(name, "--" + name.replace("_", "-"))


def env_name(name: str) -> str:
    """The variable of field ``name``."""
    return f"{PREFIX}SCHEMA" if name == "db_schema" else f"{PREFIX}{name.upper()}"


__all__ = ["PREFIX", "SETTINGS", "CommonSettings", "ConsumerSettings", "RelaySettings",
           "env_name", "flag"]
