"""A consumer refuses bad configuration when it is built, before touching any service."""

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from consumerkit import (
    ConfigurationError,
    Consumer,
    HandlerContext,
    HandlerDefinitionError,
    HandlerRegistry,
    Kafka,
    Limits,
    Postgres,
    Timeouts,
    handler,
)

from . import handlers_future


class Paid(BaseModel):
    order_id: str


@handler("order.paid")
async def on_paid(event: Paid, ctx: HandlerContext) -> None:
    del event, ctx


def build(**overrides: Any) -> Consumer:
    options: dict[str, Any] = {
        "name": "billing", "handlers": [on_paid], "topics": ["orders"],
        "kafka": Kafka(bootstrap="127.0.0.1:9092"),
        "postgres": Postgres(dsn="postgresql://u:secret@db/app"),
    }
    return Consumer(**{**options, **overrides})


def test_a_valid_consumer_freezes_its_registry_and_hides_the_password() -> None:
    registry = HandlerRegistry([on_paid])
    consumer = build(handlers=[registry])
    assert "secret" not in repr(consumer)
    with pytest.raises(HandlerDefinitionError, match="frozen"):
        registry.include(handlers_future.charge)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"handlers": []}, "no handlers given"),
    ({"handlers": [handlers_future.cancel]}, "cannot resolve the annotations"),
    ({"topics": []}, "at least one topic"),
    ({"topics": ["bad topic"]}, "invalid topic"),
    ({"name": "billing;drop"}, "invalid consumer name"),
    ({"dead_letter": []}, "dead-letter destination"),
    ({"kafka": Kafka(consumer_options={"enable_auto_commit": True})}, "enable_auto_commit"),
    ({"kafka": Kafka(options={"isolation_level": "read_uncommitted"})}, "isolation_level"),
    ({"kafka": Kafka(consumer_options={"sesion_timeout_ms": 1})},
     "unknown Kafka consumer options"),
    ({"kafka": Kafka(options={"session_timeout_ms": 1})},
     r"belong in Kafka\(consumer_options=...\)"),
    ({"kafka": Kafka(options={"acks": 1})}, "unknown Kafka consumer options: acks"),
    ({"kafka": Kafka(consumer_options={"max_poll_records": "many"})}, "positive integer"),
    ({"limits": {"max_batch": 5}}, r"limits= takes a Limits\(...\), not dict"),
])
def test_bad_configuration_is_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        build(**overrides)


@pytest.mark.parametrize(("group", "message"), [
    (lambda: Postgres(schema="Bad-Schema"), r"Postgres\.schema: invalid schema name"),
    (lambda: Limits(concurrency=0), r"Limits\.concurrency must be at least 1, not 0"),
    (lambda: Timeouts(shutdown=0), r"Timeouts\.shutdown must be greater than 0"),
    (lambda: Timeouts(handler=float("nan")), r"Timeouts\.handler must be a finite number"),
    (lambda: Postgres(pooler="pgpool"),  # type: ignore[arg-type]
     r"Postgres\.pooler must be 'none', 'session' or 'transaction', not 'pgpool'"),
])
def test_a_bad_option_is_refused_by_its_group(group: Callable[[], object],
                                              message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        group()


def test_unsafe_kafka_options_are_refused() -> None:
    from consumerkit.transport.kafka import consumer_options, producer_options

    with pytest.raises(ConfigurationError, match="enable_auto_commit"):
        consumer_options({"enable_auto_commit": True})
    with pytest.raises(ConfigurationError, match="isolation_level"):
        consumer_options({"isolation_level": "read_uncommitted"})
    with pytest.raises(ConfigurationError, match="acks=1 is not allowed"):
        producer_options({"acks": 1})
    assert producer_options({"enable_idempotence": False})["acks"] == "all"
    safe = consumer_options({"session_timeout_ms": 3000})
    assert safe["enable_auto_commit"] is False
    assert safe["auto_offset_reset"] == "earliest"
    assert safe["isolation_level"] == "read_committed"


def test_two_handlers_for_one_event_type_are_refused() -> None:
    def twin() -> Callable[..., Any]:
        @handler("order.paid")
        async def again(event: Paid, ctx: HandlerContext) -> None:
            del event, ctx
        return again

    with pytest.raises(HandlerDefinitionError, match="two handlers"):
        build(handlers=[on_paid, twin()])
