"""``consumerkit check`` and a broker that may lose what it acknowledged: replication factor,
``min.insync.replicas``, unclean leader election, the relay's idempotent producer.

On Apache Kafka (three brokers; skipped, with the reason, without Java or Maven) each
misconfiguration is named. On Tansu (one node, no topic configs, no idempotent producer) what
can be read is reported and what cannot is one ``note`` line, never a traceback."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumerkit.cli.check_kafka import TopicDurability, durability_findings
from consumerkit.testing.services import start_tansu
from tests.harness.kafka import KafkaCluster

from .conftest import cli, with_password


@pytest.fixture(scope="module")
def tansu() -> Iterator[str]:
    """A Tansu broker of this module's own, whatever broker the session uses."""
    with start_tansu() as broker:
        yield broker.bootstrap


def lines(out: str, start: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(start)]


async def test_check_on_tansu_reports_what_it_read_and_what_it_could_not(
    tansu: str, tmp_path: Path, postgres_dsn: str, pg_schema: str,
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=tansu, request_timeout_ms=10_000)
    await admin.start()
    try:
        await admin.create_topics([NewTopic("orders", 2, 1), NewTopic("invoices", 1, 1)])
    finally:
        await admin.close()
    env = {"CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn),
           "CONSUMERKIT_POSTGRES_SCHEMA": pg_schema}
    assert (await cli("migrate", cwd=tmp_path, env=env)).code == 0
    base = ["check", "--kafka", tansu, "--topic", "orders", "--published-topic", "invoices"]

    done = await cli(*base, cwd=tmp_path, env=env)
    assert "Traceback" not in done.output
    assert done.code == 1
    problems = lines(done.out, "PROBLEM")
    for topic in ("orders", "invoices"):  # a warning: a development cluster may have one node
        assert (f"WARNING  topic {topic} has replication factor 1, under 3: losing its broker "
                "loses records already acknowledged") in lines(done.out, "WARNING")
    assert (f"PROBLEM  the relay's idempotent producer: the Kafka broker at {tansu} answered "
            "but refused the idempotent producer (InitProducerId answered UnknownError), as a "
            "broker without one does (Tansu, for one); turn it off with "
            "--no-enable-idempotence or CONSUMERKIT_ENABLE_IDEMPOTENCE=false") in problems
    notes = [n for n in lines(done.out, "note") if "not verified" in n]
    assert notes == [
        "note     not verified, the broker did not describe them: min.insync.replicas of "
        "invoices, orders; unclean.leader.election.enable of invoices, orders"]

    # what the broker allows, stated: only the notes remain
    done = await cli(*base, "--min-replication", "1", "--no-enable-idempotence",
                     cwd=tmp_path, env=env)
    assert not lines(done.out, "WARNING"), done.out
    assert not lines(done.out, "PROBLEM"), done.out
    assert len([n for n in lines(done.out, "note") if "not verified" in n]) == 1
    assert (done.code, done.out.splitlines()[-1]) == (0, "all clear")

    # warnings alone leave the exit status 0: a development cluster may be meant so
    done = await cli("check", "--kafka", tansu, "--topic", "orders", cwd=tmp_path, env=env)
    assert (done.code, done.out.splitlines()[-1]) == (0, "all clear (1 warning)"), done.out


async def test_without_published_topics_the_relay_is_not_checked(
    tansu: str, tmp_path: Path,
) -> None:
    done = await cli("check", "--kafka", tansu, "--min-replication", "1", cwd=tmp_path)
    assert "idempotent" not in done.output


def test_each_setting_that_loses_records_is_named_once() -> None:
    """The judgement itself, on values a broker may give (a 3-broker cluster's good ones
    included, so the check can also pass)."""
    good = TopicDurability(replication=3, min_insync=2, unclean=False)
    assert durability_findings({"a": good}) == []
    bad = TopicDurability(replication=2, min_insync=1, unclean=True)
    found = [f.message for f in durability_findings({"a": bad})]
    assert found == [
        "topic a has replication factor 2, under 3: losing brokers loses records already "
        "acknowledged",
        "topic a has min.insync.replicas=1, under 2: acks=all is then satisfied by 1 broker, "
        "whose loss loses the record",
        "topic a has unclean.leader.election.enable=true: a replica that missed acknowledged "
        "records can become leader, and those records are lost; set it to false"]
    one = TopicDurability(replication=1, min_insync=1, unclean=False)
    assert durability_findings({"a": one}, replication=1) == []


async def test_check_on_apache_kafka_names_each_misconfiguration(
    kafka_cluster: KafkaCluster, tmp_path: Path,
) -> None:
    """Three brokers: a topic made unsafe in every way, and one with the cluster's defaults
    (replication factor 3, min.insync.replicas=2, unclean election off) that passes."""
    suffix = uuid.uuid4().hex[:8]
    bad, good = f"ck-bad-{suffix}", f"ck-good-{suffix}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_cluster.bootstrap,
                                request_timeout_ms=30_000)
    await admin.start()
    try:
        await admin.create_topics([
            NewTopic(bad, 2, 1, topic_configs={"min.insync.replicas": "1",
                                               "unclean.leader.election.enable": "true"}),
            NewTopic(good, 2, 3)])
    finally:
        await admin.close()
    bootstrap = kafka_cluster.bootstrap

    done = await cli("check", "--kafka", bootstrap, "--topic", bad, "--published-topic", good,
                     "--no-enable-idempotence", cwd=tmp_path)
    assert "Traceback" not in done.output
    assert done.code == 1  # no database; the rest are warnings
    assert [line for line in lines(done.out, "PROBLEM") if "database" not in line] == []
    assert lines(done.out, "WARNING") == [
        "WARNING  the relay's idempotent producer is off (CONSUMERKIT_ENABLE_IDEMPOTENCE=false "
        f"or --no-enable-idempotence) but the broker at {bootstrap} grants it: turn it on; "
        "without it a batch the producer sends again after a lost acknowledgement is written "
        "twice",
        f"WARNING  topic {bad} has replication factor 1, under 3: losing its broker loses "
        "records already acknowledged",
        f"WARNING  topic {bad} has min.insync.replicas=1, under 2: acks=all is then satisfied "
        "by 1 broker, whose loss loses the record",
        f"WARNING  topic {bad} has unclean.leader.election.enable=true: a replica that missed "
        "acknowledged records can become leader, and those records are lost; set it to false"]
    assert "not verified" not in done.out  # Apache Kafka describes every config

    done = await cli("check", "--kafka", bootstrap, "--topic", good, "--published-topic", good,
                     cwd=tmp_path)
    assert [line for line in lines(done.out, "PROBLEM") if "database" not in line] == []
    assert not lines(done.out, "WARNING")
    assert "not verified" not in done.out
    assert f"ok       topics present: {good}" in done.out
