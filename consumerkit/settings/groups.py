"""The option groups: one definition of each setting (name, type, default, constraints, doc).

:class:`~consumerkit.Consumer` and :class:`~consumerkit.outbox.Relay` take them as arguments
(``Consumer(..., postgres=Postgres(dsn=...), limits=Limits(max_batch=100))``), and the
settings of ``consumerkit run`` and ``consumerkit relay`` nest them, so each field is also a
variable (``CONSUMERKIT_<GROUP>_<FIELD>``: ``CONSUMERKIT_LIMITS_MAX_BATCH``), a flag
(``--limits-max-batch``) and a row of the configuration page. The fields a group was given
(pydantic's ``model_fields_set``) are those its code chose: settings never override them
(:mod:`.precedence`).
"""

from __future__ import annotations

import json
import ssl
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import NoDecode

from ..errors import ConfigurationError
from ..shared.identifiers import identifier
from ..shared.pooler import Pooler
from .invalid import invalid

COUNT_MAX = 1_000_000
"""The most records or rows a count setting (batch, concurrency, stall) may name."""
IN_FLIGHT_MAX = 10_000_000
"""The most records fetched and not yet committed."""
SECONDS_MAX = 86_400.0
"""The longest timeout or delay, in seconds (a day): a larger one is a typo, and infinity or
NaN would reach asyncio's timers."""

Seconds = Annotated[float, Field(gt=0, le=SECONDS_MAX, allow_inf_nan=False)]


class Group(BaseModel):
    """An immutable group of related options; unknown names are refused. A bad value is a
    one-line :class:`~consumerkit.errors.ConfigurationError` (:mod:`.invalid`), however the
    group is built: called, :meth:`model_validate`, or :meth:`model_copy` with ``update``."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise invalid(type(self), exc) from None

    # pydantic calls a model's own __init__ when it validates it as a field of another; this
    # mark keeps its ValidationError there, which the settings (whose field is a group) turn
    # into a message naming the flag and the variable (cli/options.py), as BaseSettings does
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, *, strict: bool | None = None,
                       from_attributes: bool | None = None, context: Any | None = None,
                       **options: Any) -> Self:
        try:
            return super().model_validate(obj, strict=strict, from_attributes=from_attributes,
                                          context=context, **options)
        except ValidationError as exc:
            raise invalid(cls, exc) from None

    def model_copy(self, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> Self:
        """A copy, with ``update``'s fields validated as the constructor does them (pydantic
        copies them unchecked); the fields set are this group's and ``update``'s."""
        if not update:
            return super().model_copy(deep=deep)
        values = {name: getattr(self, name) for name in type(self).model_fields}
        copy = type(self)(**{**values, **update})
        object.__setattr__(copy, "__pydantic_fields_set__",
                           self.model_fields_set | set(update))
        return copy

    def merged(self, given: Self) -> Self:
        """This group with the fields ``given`` was given in place of its own (a default
        group with a test's or a caller's choices laid over it)."""
        return self.model_copy(update={f: getattr(given, f) for f in given.model_fields_set})

    def chosen(self) -> frozenset[str]:
        """The fields the code chose: given, and not ``None`` where ``None`` is the default
        (``Postgres(dsn=None)`` leaves the DSN to the settings, as leaving it out does)."""
        fields = type(self).model_fields
        return frozenset(name for name in self.model_fields_set
                         if not (getattr(self, name) is None and fields[name].default is None))


with warnings.catch_warnings():
    # ``schema`` shadows pydantic's deprecated ``BaseModel.schema()``, which no one here calls
    warnings.filterwarnings("ignore", "Field name \"schema\"", UserWarning)

    class Postgres(Group):
        """The database: where consumerkit's tables are and what stands in front of it."""

        dsn: SecretStr | None = Field(
            default=None, description="PostgreSQL DSN (`postgresql://user:password@host:5432/db`); "
            "never printed with its password")
        schema: str = Field(  # type: ignore[assignment]
            default="consumerkit", description="the PostgreSQL schema of consumerkit's tables")
        pooler: Pooler = Field(
            default="none", description="what stands in front of PostgreSQL: `none` (a direct "
            "connection), `session` or `transaction` (PgBouncer's `pool_mode`); "
            "`transaction` turns the statement cache off and keeps no session state: the "
            "relay leases its slots in a table and polls")
        listen_dsn: SecretStr | None = Field(
            default=None, description="with `pooler` `transaction`, the relay only: a DSN reaching "
            "PostgreSQL directly, on which the relay LISTENs to be woken by commits (unset: "
            "it polls); never printed with its password")

        if TYPE_CHECKING:  # a type checker's view: a DSN may be given as plain text
            def __init__(self, *, dsn: str | SecretStr | None = ..., schema: str = ...,
                         pooler: Pooler = ..., listen_dsn: str | SecretStr | None = ...,
                         ) -> None: ...

        @field_validator("schema")
        @classmethod
        def _schema(cls, value: str) -> str:
            try:
                identifier(value, "schema name")
            except ConfigurationError as exc:  # pydantic reports a ValueError as invalid
                raise ValueError(str(exc)) from None
            return value

        def url(self) -> str | None:
            """The DSN in clear, for the database driver only."""
            return self.dsn.get_secret_value() if self.dsn is not None else None


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class Kafka(Group):
    """The brokers, the clients' options, TLS and SASL."""

    bootstrap: str | None = Field(
        default=None, description="Kafka bootstrap servers, `HOST:PORT[,HOST:PORT...]`")
    options: dict[str, Any] = Field(
        default_factory=dict, description="aiokafka options for every Kafka client (a JSON "
        "object in the variable; no flag)")
    consumer_options: dict[str, Any] = Field(
        default_factory=dict, description="aiokafka options of the consumer alone, over "
        "`options` (a JSON object in the variable; no flag)")
    security_protocol: SecurityProtocol = Field(
        default="PLAINTEXT", description="how clients talk to the brokers")
    sasl_mechanism: SaslMechanism | None = Field(
        default=None, description="the SASL mechanism")
    sasl_plain_username: str | None = Field(default=None, description="the SASL user name")
    sasl_plain_password: SecretStr | None = Field(default=None, description="the SASL password")
    ssl_cafile: str | None = Field(
        default=None, description="TLS: the CA bundle that signs the brokers' certificates")
    ssl_certfile: str | None = Field(
        default=None, description="TLS: the client certificate (mutual TLS)")
    ssl_keyfile: str | None = Field(default=None, description="TLS: the client key")
    ssl_password: SecretStr | None = Field(
        default=None, description="TLS: the client key's password")

    if TYPE_CHECKING:  # a type checker's view: a password may be given as plain text
        def __init__(
            self, *, bootstrap: str | None = ..., options: dict[str, Any] = ...,
            consumer_options: dict[str, Any] = ...,
            security_protocol: SecurityProtocol = ..., sasl_mechanism: SaslMechanism | None = ...,
            sasl_plain_username: str | None = ...,
            sasl_plain_password: str | SecretStr | None = ..., ssl_cafile: str | None = ...,
            ssl_certfile: str | None = ..., ssl_keyfile: str | None = ...,
            ssl_password: str | SecretStr | None = ...,
        ) -> None: ...

    def client_options(self) -> dict[str, Any]:
        """aiokafka options for every client: TLS and SASL (only those that differ from
        aiokafka's defaults), then :attr:`options`, which win."""
        found: dict[str, Any] = {}
        if self.security_protocol != "PLAINTEXT":
            found["security_protocol"] = self.security_protocol
        if self.sasl_mechanism is not None:
            found["sasl_mechanism"] = self.sasl_mechanism
        if self.sasl_plain_username is not None:
            found["sasl_plain_username"] = self.sasl_plain_username
        if self.sasl_plain_password is not None:
            found["sasl_plain_password"] = self.sasl_plain_password.get_secret_value()
        if "SSL" in self.security_protocol or self.ssl_cafile or self.ssl_certfile:
            found["ssl_context"] = self._ssl_context()
        return {**found, **self.options}

    def _ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ssl_cafile)
        if self.ssl_certfile:
            password = self.ssl_password.get_secret_value() if self.ssl_password else None
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, password)
        return context

    def secret_values(self) -> list[str]:
        return [s.get_secret_value() for s in (self.sasl_plain_password, self.ssl_password)
                if s is not None]


class Limits(Group):
    """How much work is held and done at once."""

    concurrency: int | None = Field(
        default=None, ge=1, le=COUNT_MAX,
        description="records (or batches) handled at once; unset: 4 with batches, 16 without")
    max_batch: int = Field(
        default=500, ge=1, le=COUNT_MAX, description="records per transaction (1: one each)")
    max_in_flight: int = Field(
        default=5000, ge=1, le=IN_FLIGHT_MAX, description="records fetched but not yet committed")
    max_message_bytes: int = Field(
        default=1 << 20, ge=1, le=1 << 30,
        description="the largest record value decoded; a larger one is dead-lettered")


class Timeouts(Group):
    """How long a handler and a graceful stop may take."""

    handler: Seconds | None = Field(
        default=60.0, description="seconds one handler call may take (unset: no limit)")
    shutdown: Seconds = Field(
        default=30.0, description="seconds a graceful stop waits for in-flight work")


class Stall(Group):
    """When a failure every record would hit stops the consumer, and how it retries."""

    after_keys: int = Field(
        default=5, ge=0, le=COUNT_MAX,
        description="stall the consumer when a handler fails with the same error type for "
        "this many keys in a row (0: only a missing table, column or schema, a missing "
        "privilege or a read-only database stall it)")
    max_delay: Seconds = Field(
        default=30.0, description="the longest wait, in seconds, between two tries while stalled")


class Metrics(Group):
    """The `/metrics`, `/healthz` and `/readyz` server."""

    port: int | None = Field(
        default=None, ge=0, le=65535,
        description="serve `/metrics`, `/healthz` and `/readyz` on this port (unset: no server)")
    host: str = Field(
        default="0.0.0.0",  # noqa: S104 - a scrape target listens on all
        description="the address the metrics server binds")
    refresh_interval: Seconds = Field(
        default=5.0, description="seconds between the queries behind the gauges: the consumer's "
        "lag, the relay's pending, oldest and failed rows (the parked keys: six times this)")


class Unhandled(Group):
    """What becomes of records whose event type no handler takes."""

    policy: Literal["dead_letter", "skip"] = Field(
        default="dead_letter", description="`dead_letter` (nothing is lost without a word: a "
        "misspelt handler's events wait in the dead letters) or `skip` (counted per event "
        "type, logged once per type, the offset moves on; for a topic shared by many event "
        "types)")
    ignore: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), description="event types skipped even with `policy=dead_letter`, as fnmatch "
        "patterns (`order.internal.*`); several separated by commas or spaces, or a JSON "
        "list in the variable")

    if TYPE_CHECKING:  # a type checker's view: the patterns may be a list or one string
        def __init__(self, *, policy: Literal["dead_letter", "skip"] = ...,
                     ignore: str | Sequence[str] = ...) -> None: ...

    @field_validator("ignore", mode="before")
    @classmethod
    def _patterns(cls, value: object) -> object:
        # an event type holds no comma or space, so either separates patterns
        if isinstance(value, str):
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else [text]
        if isinstance(value, (list, tuple)):
            return tuple(p for item in value for p in str(item).replace(",", " ").split())
        return value


GROUPS: dict[str, type[Group]] = {
    "postgres": Postgres, "kafka": Kafka, "limits": Limits, "timeouts": Timeouts,
    "stall": Stall, "metrics": Metrics, "unhandled": Unhandled}
"""Each group by the argument (and settings field) that takes it."""

__all__ = ["GROUPS", "Group", "Kafka", "Limits", "Metrics", "Postgres", "Stall", "Timeouts",
           "Unhandled"]
