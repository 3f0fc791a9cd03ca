"""Kafka Connect and Debezium's PostgreSQL connector from Maven Central, fetched once into the
same cache as Apache Kafka's jars (:mod:`tests.harness.kafka_jars`).

The worker is ``org.apache.kafka:connect-runtime`` at the Kafka version of the test cluster. The
connector is ``io.debezium:debezium-connector-postgres``; from Debezium 3.6 on the outbox
EventRouter (``io.debezium.transforms.outbox.EventRouter``) lives in
``io.debezium:debezium-connect-plugins`` rather than ``debezium-core``, so the pom names it
explicitly instead of trusting a transitive path that may change again.
"""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path
from xml.sax.saxutils import escape

from consumerkit.testing._common import ServiceStartError

from .kafka_jars import (
    FETCH_TIMEOUT,
    _copy_dependencies,
    _jar_versions,
    _locked,
    kafka_cache_dir,
    logging_binding,
    require_tools,
)

__all__ = ["DEBEZIUM_KAFKA_VERSION", "DEBEZIUM_VERSION", "EVENT_ROUTER", "connect_artifacts",
           "connect_lib"]

DEBEZIUM_VERSION = "3.6.1.Final"
DEBEZIUM_KAFKA_VERSION = "4.3.0"
"""The Kafka that Debezium 3.6.1.Final is built against (its pom's ``version.kafka``). Connect
must run that version: 4.4.0 moved ``org.apache.kafka.common.utils.Sanitizer``, which the
connector's task still loads, and the task fails at start. The broker may be any 4.x."""
EVENT_ROUTER = "io.debezium.transforms.outbox.EventRouter"
_DEBEZIUM_VERSION = re.compile(r"^\d+\.\d+\.\d+\.[A-Za-z0-9]+$")
_COMPLETE = "complete"


def connect_artifacts(kafka_version: str, debezium_version: str) -> list[tuple[str, str, str]]:
    """The ``(groupId, artifactId, version)`` a Connect worker with Debezium needs."""
    if not _DEBEZIUM_VERSION.match(debezium_version):
        raise ValueError(f"Debezium version must look like 3.6.1.Final, not {debezium_version!r}")
    return [
        ("org.apache.kafka", "connect-runtime", kafka_version),
        ("io.debezium", "debezium-connector-postgres", debezium_version),
        ("io.debezium", "debezium-connect-plugins", debezium_version),  # the EventRouter
    ]


def _pom(artifacts: list[tuple[str, str, str]]) -> str:
    body = "\n".join(
        f"    <dependency><groupId>{escape(g)}</groupId><artifactId>{escape(a)}</artifactId>"
        f"<version>{escape(v)}</version></dependency>" for g, a, v in artifacts)
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>consumerkit.testing</groupId>\n"
        "  <artifactId>connect-runtime</artifactId><version>1</version>\n"
        "  <packaging>pom</packaging>\n"
        f"  <dependencies>\n{body}\n  </dependencies>\n"
        "</project>\n"
    )


def _holds(lib: Path, class_name: str) -> bool:
    entry = class_name.replace(".", "/") + ".class"
    for jar in lib.glob("*.jar"):
        try:
            with zipfile.ZipFile(jar) as archive:
                if entry in archive.namelist():
                    return True
        except zipfile.BadZipFile:
            continue
    return False


def connect_lib(kafka_version: str = DEBEZIUM_KAFKA_VERSION,
                debezium_version: str = DEBEZIUM_VERSION,
                timeout: float = FETCH_TIMEOUT) -> Path:
    """The directory of a Connect worker's jars with Debezium's PostgreSQL connector and the
    outbox EventRouter, fetched through Maven on first use."""
    artifacts = connect_artifacts(kafka_version, debezium_version)
    cache = kafka_cache_dir(kafka_version).parent
    home = cache / f"connect-{kafka_version}-debezium-{debezium_version}"
    lib = home / "lib"
    if (home / _COMPLETE).exists():
        return lib
    _, mvn = require_tools(maven=True)
    assert mvn is not None
    with _locked(cache / f"{home.name}.lock", timeout):
        if (home / _COMPLETE).exists():
            return lib
        staging = home / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        # Twice, as for the broker: first to learn the logging versions this Kafka resolves.
        _copy_dependencies(mvn, home, _pom(artifacts), staging, timeout)
        binding = logging_binding(kafka_version, _jar_versions(staging))
        _copy_dependencies(mvn, home, _pom([*artifacts, *binding]), staging, timeout)
        if not _holds(staging, EVENT_ROUTER):
            raise ServiceStartError(
                f"no jar fetched for Debezium {debezium_version} holds {EVENT_ROUTER}: the "
                f"module that carries it moved again; see {staging}")
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
        (home / _COMPLETE).write_text(
            "".join(f"{g}:{a}:{v}\n" for g, a, v in artifacts))
    return lib
