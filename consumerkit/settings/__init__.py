"""The settings of ``consumerkit run`` and ``consumerkit relay``, built of the option groups.

Each group (:mod:`.groups`) is a field, so each of its fields is a setting named
``group.field``: the variable is ``CONSUMERKIT_`` and the name in upper case, a ``_`` for the
dot (``postgres.dsn`` is ``CONSUMERKIT_POSTGRES_DSN``, ``limits.max_batch``
``CONSUMERKIT_LIMITS_MAX_BATCH``), the flag ``--`` and the name with ``-`` for dots and
underscores (``--postgres-dsn``, ``--limits-max-batch``). The other fields (``log_level``,
the relay's ``table``...) are named alike without a group. Which value wins is decided in one
place, :mod:`.precedence`. DSNs and passwords are :class:`~pydantic.SecretStr`: their
``repr`` and ``str`` are ``**********``. The configuration reference in the docs is generated
from these models (``python -m consumerkit.settings.reference``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from ..shared.dsn import dsn_secrets
from .groups import (
    COUNT_MAX,
    SECONDS_MAX,
    Group,
    Kafka,
    Limits,
    Metrics,
    Postgres,
    Stall,
    Timeouts,
    Unhandled,
)

PREFIX = "CONSUMERKIT_"


class KnownOnly(PydanticBaseSettingsSource):
    """Variables (or ``.env`` lines) of a group's fields alone: another that shares a group's
    prefix (``CONSUMERKIT_KAFKA_CACHE``, a test harness's) is no setting, and ignored as any
    unknown ``CONSUMERKIT_*`` variable is, rather than refused by the group."""

    def __init__(self, settings_cls: type[BaseSettings],
                 source: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self.source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.source.get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        found = self.source()
        for name, value in found.items():
            group = self.settings_cls.model_fields[name].annotation if (
                name in self.settings_cls.model_fields) else None
            if isinstance(value, dict) and isinstance(group, type) and issubclass(group, Group):
                found[name] = {k: v for k, v in value.items() if k in group.model_fields}
        return found


class CommonSettings(BaseSettings):
    """What every runnable needs: the services, metrics, logs, Kafka security."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_file=".env", extra="ignore", env_nested_delimiter="_",
        env_nested_max_split=1, validate_default=True)

    postgres: Postgres = Postgres()
    kafka: Kafka = Kafka()
    metrics: Metrics = Metrics()
    log_format: Literal["text", "json"] = Field(
        default="text", description="`text` for a terminal, `json` for one object per line")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        default="INFO", description="the lowest level logged")
    uvloop: bool = Field(
        default=True, description="run on uvloop when it is installed (the `fast` extra); "
        "false: the standard asyncio loop")
    gc_tuning: bool = Field(
        default=True, description="once started, freeze the start-up objects and collect the young "
        "generation every 50,000 allocations instead of 700 (see operations); false: "
        "CPython's defaults")

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, KnownOnly(settings_cls, env_settings),
                KnownOnly(settings_cls, dotenv_settings), file_secret_settings)

    @field_validator("log_level", mode="before")
    @classmethod
    def _level(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    def secret_values(self) -> list[str]:
        """Every secret in clear, the DSN whole and its password: what output must never
        show, whatever the source (flag, variable, ``.env``)."""
        # a DSN without a password is no secret: the errors show it as they show any other
        # (user, host, port, database)
        listen = self.postgres.listen_dsn
        return (self.kafka.secret_values() + dsn_secrets(self.dsn() or "")
                + dsn_secrets(listen.get_secret_value() if listen else ""))

    def dsn(self) -> str | None:
        """The DSN in clear, for the database driver only."""
        return self.postgres.url()


class ConsumerSettings(CommonSettings):
    """``consumerkit run``: gives the consumer every option its code left unchosen. Code that
    builds its consumer from them passes the groups: ``Consumer(..., **settings.options())``.
    """

    limits: Limits = Limits()
    timeouts: Timeouts = Timeouts()
    stall: Stall = Stall()
    unhandled: Unhandled = Unhandled()
    offset_store: Literal["kafka", "postgres"] = Field(
        default="postgres", description="where each partition's next offset is kept: `postgres` "
        "also stores it in the effects' transactions and trusts it on assignment; `kafka` "
        "only on the broker")

    def options(self) -> dict[str, Any]:
        """The consumer's option groups and ``offset_store``, by the argument that takes
        each (what :meth:`Consumer.set_options` takes too)."""
        return {name: getattr(self, name) for name in (*CONSUMER_GROUPS, "offset_store")}


CONSUMER_GROUPS = ("postgres", "kafka", "limits", "timeouts", "stall", "metrics", "unhandled")
"""The groups :class:`~consumerkit.Consumer` takes, all of them settings of ``run``."""


class RelaySettings(CommonSettings):
    """``consumerkit relay``: one outbox published to Kafka, or to a webhook when
    ``webhook_url`` is set."""

    table: str = Field(default="outbox", description="the outbox table")
    route: str = Field(
        default="{aggregate_type}", description="Kafka topic template; `{event_type}` and "
        "`{aggregate_type}` are replaced by the event's values")
    batch_size: int = Field(
        default=500, ge=1, le=COUNT_MAX, description="rows claimed and sent per round")
    poll_interval: float = Field(
        default=1.0, gt=0, le=SECONDS_MAX, allow_inf_nan=False,
        description="seconds between polls when no notification comes")
    notify: bool = Field(default=True, description="wake on LISTEN/NOTIFY (off behind a pooler)")
    name: str | None = Field(default=None, description="the relay's name in logs (unset: host:pid)")
    enable_idempotence: bool = Field(
        default=True, description="Kafka's idempotent producer (off for brokers without it)")
    auto_create_topics: bool = Field(
        default=False, description="let the broker create a topic the route names on first use "
        "(off: a missing topic is an error naming it, and its events wait until it exists)")
    webhook_url: str | None = Field(
        default=None, description="post each event to this URL instead of publishing it to Kafka")
    webhook_headers: dict[str, SecretStr] = Field(
        default_factory=dict, description="headers added to every webhook request (a JSON "
        "object in the variable; never printed)")
    webhook_secrets: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="Standard Webhooks secrets (`whsec_...`) that sign "
        "every webhook request, one signature each (rotation); several separated by spaces "
        "or a JSON list in the variable; never printed")
    webhook_timeout: float = Field(
        default=10.0, gt=0, le=SECONDS_MAX, allow_inf_nan=False,
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

ALIASES = {"postgres.dsn": ("--postgres",), "kafka.bootstrap": ("--kafka",),
           "postgres.schema": ("--schema",), "postgres.listen_dsn": ("--postgres-listen",)}
"""Short flags kept beside the derived ones."""
FLAGS = {"webhook_headers": "--webhook-header", "webhook_secrets": "--webhook-secret"}
"""Flags given once per item, named in the singular."""


def settings_fields(model: type[CommonSettings]) -> Iterator[tuple[str, FieldInfo]]:
    """Each setting of ``model`` by its name (``postgres.dsn``, ``log_level``), with its
    field: a group's fields in its place."""
    for name, field in model.model_fields.items():
        group = field.annotation
        if isinstance(group, type) and issubclass(group, Group):
            for inner, info in group.model_fields.items():
                yield f"{name}.{inner}", info
        else:
            yield name, field


def value(settings: CommonSettings, name: str) -> object:
    """The value of setting ``name`` (``postgres.dsn``) in ``settings``."""
    found: object = settings
    for part in name.split("."):
        found = getattr(found, part)
    return found


def flag(name: str) -> str:
    """The command-line flag of setting ``name``."""
    return FLAGS.get(name, "--" + name.replace(".", "-").replace("_", "-"))


def env_name(name: str) -> str:
    """The variable of setting ``name``."""
    return PREFIX + name.replace(".", "_").upper()


__all__ = ["ALIASES", "CONSUMER_GROUPS", "PREFIX", "SETTINGS", "CommonSettings",
           "ConsumerSettings", "RelaySettings", "env_name", "flag", "settings_fields", "value"]
