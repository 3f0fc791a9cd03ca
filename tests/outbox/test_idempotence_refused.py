"""A broker that answers but refuses the idempotent producer (Tansu refuses ``InitProducerId``
with UnknownError) is named as such, with the setting that turns it off: never "cannot reach
the Kafka broker", which would be false."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from consumerkit import Postgres
from consumerkit.errors import IdempotenceRefusedError, StartupError
from consumerkit.outbox import KafkaSink, OutboxTable, Relay
from consumerkit.testing.services import start_tansu

from ..cli.conftest import cli, with_password
from ..pooling import POOLER


@pytest.fixture(scope="module")
def tansu() -> Iterator[str]:
    """A Tansu broker of this module's own, whatever broker the session uses: the refusal
    is Tansu's (Apache Kafka grants the idempotent producer)."""
    with start_tansu() as broker:
        yield broker.bootstrap


async def test_the_relay_says_the_broker_refused_the_idempotent_producer(
    tansu: str, postgres_dsn: str, outbox_table: OutboxTable,
) -> None:
    sink = KafkaSink(tansu, route="orders")  # idempotence on: the default
    relay = Relay(Postgres(dsn=postgres_dsn, schema=outbox_table.schema, pooler=POOLER), sink,
                  handle_signals=False)
    with pytest.raises(IdempotenceRefusedError) as caught:
        await relay.run()
    message = str(caught.value)
    assert message == (
        f"the Kafka broker at {tansu} answered but refused the idempotent producer "
        "(InitProducerId answered UnknownError), as a broker without one does (Tansu, for "
        "one); turn it off with enable_idempotence=False in the producer's Kafka options")
    assert "cannot reach" not in message
    assert not caught.value.denied


async def test_an_unreachable_broker_is_still_called_unreachable() -> None:
    """The other side of the line: no answer at all is not a refusal."""
    sink = KafkaSink("127.0.0.1:1", route="orders", kafka_options={"request_timeout_ms": 2000})
    with pytest.raises(StartupError) as caught:
        await sink.open()
    assert str(caught.value).startswith("cannot reach the Kafka broker at 127.0.0.1:1: ")
    assert not isinstance(caught.value, IdempotenceRefusedError)


async def test_the_relay_command_names_its_flag_and_variable(
    tansu: str, tmp_path: Path, postgres_dsn: str, outbox_table: OutboxTable,
    pg_pool: asyncpg.Pool[asyncpg.Record],
) -> None:
    env = {"CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn),
           "CONSUMERKIT_POSTGRES_SCHEMA": outbox_table.schema}
    done = await cli("relay", "--kafka", tansu, "--route", "orders", cwd=tmp_path, env=env)
    assert done.code == 1
    assert done.err.strip().splitlines()[-1] == (
        f"consumerkit: the Kafka broker at {tansu} answered but refused the idempotent "
        "producer (InitProducerId answered UnknownError), as a broker without one does "
        "(Tansu, for one); turn it off with --no-enable-idempotence or "
        "CONSUMERKIT_ENABLE_IDEMPOTENCE=false")
    assert "Traceback" not in done.err
    assert "cannot reach" not in done.err
