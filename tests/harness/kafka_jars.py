"""Apache Kafka's runtime jars from Maven Central, fetched once into a cache outside the repository.

A small generated pom names the broker (``org.apache.kafka:kafka_2.13``) and a logging binding;
Maven's dependency plugin copies the runtime jars into ``<cache>/kafka-<version>/lib``. The cache
is ``$CONSUMERKIT_KAFKA_CACHE``, else ``~/.cache/consumerkit``; a file lock keeps two processes
from fetching at once, and a marker file tells a complete fetch from an interrupted one.

4.x logs through log4j2, so its binding is ``log4j-slf4j-impl`` at the log4j2 version the release
itself resolves; 3.x logs through reload4j, bound by ``slf4j-reload4j``. Without a binding SLF4J
falls back to no-op and a broker that fails says nothing.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from xml.sax.saxutils import escape

from consumerkit.testing._common import ServiceStartError

__all__ = [
    "CACHE_ENV",
    "DEFAULT_KAFKA_VERSION",
    "MissingToolError",
    "kafka_cache_dir",
    "kafka_lib",
    "logging_binding",
    "pom_xml",
    "require_tools",
]

DEFAULT_KAFKA_VERSION = "4.4.0"
CACHE_ENV = "CONSUMERKIT_KAFKA_CACHE"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
FETCH_TIMEOUT = 900.0  # a first fetch downloads about 60 MB
_LOCK_POLL = 0.5
_COMPLETE = "complete"
_VERSION = re.compile(r"^\d+\.\d+\.\d+$")
_JAVA_MAJOR = re.compile(r'version "(\d+)(?:\.(\d+))?')
_LOG4J2_FALLBACK = "2.25.5"
_SLF4J_FALLBACK = "1.7.36"


class MissingToolError(ServiceStartError):
    """A program the real Kafka broker needs (Java 17+, Maven) is not installed.

    Its one-line message names what to install; the tests that need Apache Kafka skip with it.
    """


def _check_version(version: str) -> str:
    if not _VERSION.match(version):
        raise ValueError(f"Kafka version must look like 4.4.0, not {version!r}")
    return version


def _major(version: str) -> int:
    return int(_check_version(version).split(".", 1)[0])


def require_tools(maven: bool = True) -> tuple[str, str | None]:
    """The paths of ``java`` (17 or newer) and, if ``maven``, ``mvn``; else MissingToolError."""
    java = shutil.which("java")
    if java is None:
        raise MissingToolError("Apache Kafka needs Java 17 or newer: install a JDK "
                               "(e.g. apt-get install openjdk-17-jdk-headless)")
    probe = subprocess.run(
        [java, "-version"], capture_output=True, text=True, timeout=60, check=False,
    )
    found = _JAVA_MAJOR.search(probe.stderr + probe.stdout)
    major = int(found.group(1)) if found else 0
    if major == 1 and found and found.group(2):  # "1.8.0" is Java 8
        major = int(found.group(2))
    if major < 17:
        raise MissingToolError(f"Apache Kafka needs Java 17 or newer, {java} is Java {major}: "
                               "install a JDK 17 (e.g. apt-get install openjdk-17-jdk-headless)")
    mvn = shutil.which("mvn") if maven else None
    if maven and mvn is None:
        raise MissingToolError("Apache Kafka's jars come from Maven Central: install Maven "
                               "(e.g. apt-get install maven)")
    return java, mvn


def logging_binding(version: str, lib_versions: dict[str, str]) -> list[tuple[str, str, str]]:
    """The ``(groupId, artifactId, version)`` of the SLF4J binding for Kafka ``version``.

    ``lib_versions`` maps artifact names already resolved for the broker to their versions, so the
    binding matches the release's own log4j2 (4.x) or SLF4J (3.x).
    """
    if _major(version) >= 4:
        log4j = lib_versions.get("log4j-api", _LOG4J2_FALLBACK)
        return [("org.apache.logging.log4j", "log4j-slf4j-impl", log4j)]
    slf4j = lib_versions.get("slf4j-api", _SLF4J_FALLBACK)
    return [("org.slf4j", "slf4j-reload4j", slf4j)]


def pom_xml(version: str, extra: Sequence[tuple[str, str, str]] = ()) -> str:
    """A pom whose runtime dependencies are Kafka ``version``'s broker plus ``extra`` artifacts."""
    deps = [("org.apache.kafka", "kafka_2.13", _check_version(version)), *extra]
    body = "\n".join(
        f"    <dependency><groupId>{escape(g)}</groupId><artifactId>{escape(a)}</artifactId>"
        f"<version>{escape(v)}</version></dependency>"
        for g, a, v in deps
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>consumerkit.testing</groupId>\n"
        f"  <artifactId>kafka-runtime</artifactId><version>{escape(version)}</version>\n"
        "  <packaging>pom</packaging>\n"
        f"  <dependencies>\n{body}\n  </dependencies>\n"
        "</project>\n"
    )


def kafka_cache_dir(version: str) -> Path:
    """Where Kafka ``version``'s jars live: ``$CONSUMERKIT_KAFKA_CACHE`` or ~/.cache/consumerkit."""
    root = os.environ.get(CACHE_ENV) or str(Path.home() / ".cache" / "consumerkit")
    return Path(root).expanduser() / f"kafka-{_check_version(version)}"


def _jar_versions(lib: Path) -> dict[str, str]:
    versions: dict[str, str] = {}
    for jar in lib.glob("*.jar"):
        found = re.match(r"^(.+?)-(\d[\w.\-]*)\.jar$", jar.name)
        if found:
            versions[found.group(1)] = found.group(2)
    return versions


@contextmanager
def _locked(path: Path, timeout: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ServiceStartError(
                        f"another process has held {path} for {timeout:g}s (a Kafka jar fetch); "
                        "wait for it or delete the lock file") from None
                time.sleep(_LOCK_POLL)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _copy_dependencies(mvn: str, workdir: Path, pom: str, out: Path, timeout: float) -> None:
    (workdir / "pom.xml").write_text(pom)
    argv = [mvn, "-B", "-q", f"{DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime", f"-DoutputDirectory={out}"]
    try:
        done = subprocess.run(
            argv, cwd=workdir, capture_output=True, text=True, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired:
        raise ServiceStartError(f"Maven did not fetch Kafka's jars within {timeout:g}s "
                                f"(in {workdir})") from None
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise ServiceStartError(f"Maven could not fetch Kafka's jars (exit {done.returncode}; "
                                f"is Maven Central reachable?), in {workdir}:\n{tail}")


def kafka_lib(version: str = DEFAULT_KAFKA_VERSION, timeout: float = FETCH_TIMEOUT) -> Path:
    """The directory of Kafka ``version``'s runtime jars, fetched through Maven on first use."""
    home = kafka_cache_dir(version)
    lib = home / "lib"
    if (home / _COMPLETE).exists():
        return lib
    _, mvn = require_tools(maven=True)
    assert mvn is not None
    with _locked(home.parent / f"kafka-{version}.lock", timeout):
        if (home / _COMPLETE).exists():  # fetched by the process that held the lock
            return lib
        staging = home / "lib.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        # Twice: the broker alone first, to learn the logging versions its release resolves.
        _copy_dependencies(mvn, home, pom_xml(version), staging, timeout)
        binding = logging_binding(version, _jar_versions(staging))
        _copy_dependencies(mvn, home, pom_xml(version, binding), staging, timeout)
        shutil.rmtree(lib, ignore_errors=True)
        staging.rename(lib)
        (home / _COMPLETE).write_text(f"kafka_2.13 {version}\n")
    return lib
