"""The parts of the Apache Kafka test cluster that need no JVM: the pom, each node's properties,
the cluster id, the jar cache and its lock, and the one-line errors without Java or Maven."""

from __future__ import annotations

import base64
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from consumerkit.errors import ConsumerKitError
from consumerkit.testing.services import ServiceStartError
from tests.harness import kafka_jars, start_kafka
from tests.harness.kafka import KafkaNode, _format
from tests.harness.kafka_config import new_cluster_id, node_properties, render_properties
from tests.harness.kafka_jars import (
    CACHE_ENV,
    MissingToolError,
    kafka_cache_dir,
    kafka_lib,
    logging_binding,
    pom_xml,
    require_tools,
)

POM = "{http://maven.apache.org/POM/4.0.0}"


def _dependencies(pom: str) -> list[tuple[str, str, str]]:
    root = ET.fromstring(pom)
    return [
        (d.findtext(f"{POM}groupId", ""), d.findtext(f"{POM}artifactId", ""),
         d.findtext(f"{POM}version", ""))
        for d in root.iter(f"{POM}dependency")
    ]


def test_pom_names_the_broker_and_the_binding() -> None:
    binding = logging_binding("4.4.0", {"log4j-api": "2.25.5", "slf4j-api": "1.7.36"})
    assert binding == [("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.5")]
    assert _dependencies(pom_xml("4.4.0", binding)) == [
        ("org.apache.kafka", "kafka_2.13", "4.4.0"),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.5"),
    ]
    assert _dependencies(pom_xml("3.9.1")) == [("org.apache.kafka", "kafka_2.13", "3.9.1")]


def test_kafka_3_binds_slf4j_to_reload4j() -> None:
    assert logging_binding("3.9.1", {"slf4j-api": "1.7.36"}) == [
        ("org.slf4j", "slf4j-reload4j", "1.7.36")]


@pytest.mark.parametrize("version", ["4.4", "latest", "4.4.0</version>", ""])
def test_a_malformed_version_is_refused(version: str) -> None:
    with pytest.raises(ValueError, match="Kafka version must look like"):
        pom_xml(version)


def test_three_nodes_replicate_three_times_with_two_in_sync(tmp_path: Path) -> None:
    ports = {1: (9001, 9101), 2: (9002, 9102), 3: (9003, 9103)}
    props = node_properties(2, ports, tmp_path)
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103")
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9002"
    assert props["log.dirs"] == str(tmp_path)
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor"):
        assert props[key] == "3", key
    assert props["min.insync.replicas"] == "2"
    assert props["transaction.state.log.min.isr"] == "2"
    assert props["unclean.leader.election.enable"] == "false"
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert int(props["log.cleaner.dedupe.buffer.size"]) <= 4 * 1024 * 1024


def test_one_node_replicates_once(tmp_path: Path) -> None:
    props = node_properties(1, {1: (9001, 9101)}, tmp_path)
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9101"
    factors = {k: v for k, v in props.items()
               if k.endswith(("replication.factor", "min.isr")) or k == "min.insync.replicas"}
    assert len(factors) == 7
    assert set(factors.values()) == {"1"}, factors
    text = render_properties(props)
    assert "process.roles=broker,controller\n" in text
    assert text.count("\n") == len(props)


def test_a_proxied_node_advertises_its_proxy_and_listens_on_its_own_port(
        tmp_path: Path) -> None:
    """Clients and the other brokers connect to the advertised address: through the proxy,
    which the torture harness holds to cut the node off (the quorum's port stays direct)."""
    ports = {1: (9001, 9101), 2: (9002, 9102), 3: (9003, 9103)}
    props = node_properties(2, ports, tmp_path, advertised_port=7002)
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:7002"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    assert node_properties(2, ports, tmp_path)["advertised.listeners"] == (
        "PLAINTEXT://127.0.0.1:9002")


def test_cluster_ids_are_16_random_bytes_in_urlsafe_base64() -> None:
    ids = {new_cluster_id() for _ in range(2000)}  # about 31 would start with "-"
    assert len(ids) == 2000
    for cluster_id in ids:
        assert len(cluster_id) == 22
        assert "=" not in cluster_id
        assert not cluster_id.startswith("-")  # StorageTool would take it for an option
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_the_jar_cache_lives_outside_the_repository(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    default = kafka_cache_dir("4.4.0")
    assert default == Path.home() / ".cache" / "consumerkit" / "kafka-4.4.0"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert kafka_cache_dir("3.9.1") == tmp_path / "kafka-3.9.1"


def test_without_java_one_line_names_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no java, no mvn
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    for attempt in (require_tools, lambda: kafka_lib("4.4.0"), lambda: start_kafka(brokers=1)):
        with pytest.raises(MissingToolError) as caught:
            attempt()
        message = str(caught.value)
        assert "\n" not in message
        assert "Java 17" in message
        assert "install" in message
        assert isinstance(caught.value, ServiceStartError)
        assert isinstance(caught.value, ConsumerKitError)


def test_without_maven_one_line_names_maven(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    try:
        java = require_tools(maven=False)[0]
    except MissingToolError as exc:
        pytest.skip(f"needs a Java to keep on PATH: {exc}")
    (tmp_path / "java").symlink_to(java)
    monkeypatch.setenv("PATH", str(tmp_path))  # java only
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(MissingToolError, match=r"^Apache Kafka's jars come from Maven Central: "
                                               r"install Maven \(e\.g\. apt-get install maven\)$"):
        kafka_lib("4.4.0")


def test_a_held_fetch_lock_times_out_with_its_path(tmp_path: Path) -> None:
    lock = tmp_path / "kafka-4.4.0.lock"
    with (kafka_jars._locked(lock, timeout=5), pytest.raises(ServiceStartError) as caught,
          kafka_jars._locked(lock, timeout=0.6)):
        pass
    assert str(lock) in str(caught.value)
    with kafka_jars._locked(lock, timeout=0.6):  # released: taken again at once
        assert lock.exists()
        assert os.access(lock, os.W_OK)


def test_only_one_or_three_brokers() -> None:
    with pytest.raises(ValueError, match="1 or 3 brokers"):
        start_kafka(brokers=2)


def _java(tmp_path: Path, fail_node: int) -> str:
    """A stand-in for ``java`` in the format step only: the run for ``fail_node`` exits 1
    without a word unless told to ignore a formatted dir (as the retry does)."""
    script = tmp_path / "java"
    script.write_text(
        "#!/bin/sh\n"
        'case "$*" in *--ignore-formatted*) echo formatted; exit 0;; '
        f'*node{fail_node}/*) exit 1;; *) echo formatted; exit 0;; esac\n')
    script.chmod(0o755)
    return str(script)


def test_a_node_whose_format_fails_once_is_formatted_again(tmp_path: Path) -> None:
    nodes = [KafkaNode(n, 0, 0, tmp_path / f"node{n}", []) for n in (1, 2, 3)]
    for node in nodes:
        node.home.mkdir()
    _format(_java(tmp_path, 3), tmp_path, nodes, "cluster", "-Dlog", 10)
    assert [(n.home / "format.log").read_text() for n in nodes] == ["formatted\n"] * 3


def test_a_node_whose_format_keeps_failing_is_named(tmp_path: Path) -> None:
    script = tmp_path / "java"
    script.write_text("#!/bin/sh\ncase \"$*\" in *node2/*) echo no space left; exit 1;; esac\n")
    script.chmod(0o755)
    nodes = [KafkaNode(n, 0, 0, tmp_path / f"node{n}", []) for n in (1, 2)]
    for node in nodes:
        node.home.mkdir()
    with pytest.raises(ServiceStartError, match="node 2 \\(exit 1\\):\nno space left"):
        _format(str(script), tmp_path, nodes, "cluster", "-Dlog", 10)
