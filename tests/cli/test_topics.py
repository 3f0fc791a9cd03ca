"""``consumerkit topics create`` against the test broker: a topic with the partitions asked
for, listed once the command returns; again, ``already present``; a bad name, no broker or an
unreachable one is one line, never a traceback."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from .conftest import cli


async def partitions(bootstrap: str, topic: str) -> set[int] | None:
    """The topic's partitions as a broker's metadata lists them (None: not listed). Asked of
    the cluster each time: a consumer's cached metadata from its start would not know it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if topic not in await admin.list_topics():  # describing a missing one may create it
            return None
        found = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return next(({p["partition"] for p in t["partitions"]} for t in found
                 if t["topic"] == topic and t["error_code"] == 0), None)


async def test_create_makes_the_topic_then_leaves_it_as_it_is(
    kafka_bootstrap: str, tmp_path: Path,
) -> None:
    topic = f"ck-topics-{uuid.uuid4().hex[:8]}"
    assert await partitions(kafka_bootstrap, topic) is None
    # the broker from the variable, as the docs' commands have it
    env = {"CONSUMERKIT_KAFKA_BOOTSTRAP": kafka_bootstrap}
    done = await cli("topics", "create", topic, "--partitions", "3", cwd=tmp_path, env=env)
    assert (done.code, done.out, done.err) == (0, f"topic {topic}: created\n", "")
    assert await partitions(kafka_bootstrap, topic) == {0, 1, 2}  # listed when it returns

    again = await cli("topics", "create", topic, "--partitions", "5", "--kafka", kafka_bootstrap,
                      cwd=tmp_path)
    assert (again.code, again.out) == (0, f"topic {topic}: already present\n")
    assert await partitions(kafka_bootstrap, topic) == {0, 1, 2}


async def test_a_bad_name_is_a_usage_error(tmp_path: Path) -> None:
    done = await cli("topics", "create", "orders/eu", "--kafka", "127.0.0.1:9", cwd=tmp_path)
    assert done.code == 2
    assert "invalid topic name 'orders/eu'" in done.err
    assert "Traceback" not in done.err


async def test_without_a_broker_it_says_which_setting_is_missing(tmp_path: Path) -> None:
    done = await cli("topics", "create", "orders", cwd=tmp_path)
    assert done.code == 1
    assert done.err == ("consumerkit: no broker: pass --kafka HOST:PORT or set "
                        "CONSUMERKIT_KAFKA_BOOTSTRAP\n")


async def test_an_unreachable_broker_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    done = await cli("topics", "create", "orders", "--kafka", f"127.0.0.1:{port}",
                     cwd=tmp_path, timeout=120)
    assert done.code == 1
    assert done.err.startswith("consumerkit: ")
    assert f"127.0.0.1:{port}" in done.err
    assert len(done.err.splitlines()) == 1, done.err
