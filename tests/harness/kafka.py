"""Apache Kafka for tests: a KRaft cluster of one or three nodes run from Maven Central's jars.

:func:`start_kafka` fetches the jars once (:mod:`tests.harness.kafka_jars`), formats one log
dir per node and starts every node in combined mode (broker and controller) with static voters on
free loopback ports. The cluster is ready when its metadata lists every broker; every wait is
bounded, and a node that dies or stays silent raises :class:`ServiceStartError` with its log's
tail. Without Java 17+ or Maven, :class:`MissingToolError` says in one line what to install.

The handle's nodes can be killed (SIGKILL), stopped, started again on the same ports and log dir,
paused (SIGSTOP) and resumed; ``leader``, ``controller`` and ``coordinator`` say which node holds
a partition, the metadata quorum or a consumer group (:mod:`tests.harness.kafka_lookup`).
With ``proxied=True`` each node advertises a :class:`TcpProxy` in front of its client port, so
``node.proxy.hold()`` cuts it off from clients and the other brokers (not from the quorum).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from consumerkit.testing._common import ServiceStartError, free_port
from consumerkit.testing._process import _Service, _tcp_accepts

from . import kafka_lookup
from .kafka_config import (
    JVM_OPTIONS,
    log_option,
    new_cluster_id,
    node_properties,
    render_properties,
)
from .kafka_jars import DEFAULT_KAFKA_VERSION, MissingToolError, kafka_lib, require_tools
from .kafka_security import KafkaSecurity
from .tcp_proxy import TcpProxy

__all__ = [
    "DEFAULT_KAFKA_VERSION",
    "KafkaCluster",
    "KafkaNode",
    "MissingToolError",
    "new_cluster_id",
    "node_properties",
    "start_kafka",
]

READY_TIMEOUT = 180.0  # three JVMs registering at once on two busy cores
STOP_TIMEOUT = 60.0  # a controlled shutdown moves leaders away first
LOOKUP_TIMEOUT = 60.0
_POLL = 0.25
_PORT_ATTEMPTS = 3

class KafkaNode:
    """One KRaft node (broker and controller) of a :class:`KafkaCluster`; its log dir and log
    file survive ``stop``/``kill`` and ``start``."""

    def __init__(self, node_id: int, port: int, controller_port: int, home: Path,
                 argv: list[str], proxy: TcpProxy | None = None) -> None:
        self.node_id = node_id
        self.port = port
        self.controller_port = controller_port
        self.proxy = proxy  # what the node advertises, if it is proxied
        self.address = f"127.0.0.1:{proxy.port if proxy is not None else port}"
        self.home = home
        self.log_path = home / "server.log"
        self._argv = argv
        self._process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"KafkaNode({self.node_id}, {self.address}, running={self.running()})"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the node's JVM (not waiting for it: see :meth:`KafkaCluster.wait_ready`)."""
        if self.running():
            return
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                self._argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.home, start_new_session=True,
            )

    def _signal(self, signum: int) -> None:
        if self._process is not None and self._process.poll() is None:
            os.kill(self._process.pid, signum)

    def kill(self) -> None:
        """SIGKILL: the node dies mid-write, as in a power cut of its process."""
        self._signal(signal.SIGCONT)  # a paused JVM must not linger as a stopped zombie
        self._signal(signal.SIGKILL)
        if self._process is not None:
            self._process.wait(STOP_TIMEOUT)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM (a controlled shutdown), then SIGKILL after ``timeout`` seconds."""
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        if self._process is not None:
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def pause(self) -> None:
        """SIGSTOP: the node stays up but answers nothing, as in a long GC pause."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        self._signal(signal.SIGCONT)

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def failure(self, reason: str) -> ServiceStartError:
        code = self._process.poll() if self._process is not None else None
        state = "is running" if code is None else f"exited with code {code}"
        return ServiceStartError(f"Kafka node {self.node_id} (pid {self.pid}) {reason} and "
                                 f"{state}; its log ({self.log_path}) ends:\n"
                                 f"{self.output()[-4000:]}")


class KafkaCluster(_Service):
    """A running Apache Kafka cluster; ``bootstrap`` lists every node's address."""

    def __init__(self, version: str, workdir: Path, nodes: list[KafkaNode]) -> None:
        self.version = version
        self.workdir = workdir
        self.nodes = nodes
        self.bootstrap = ",".join(node.address for node in nodes)
        atexit.register(self.stop)

    def node(self, node_id: int) -> KafkaNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no Kafka node {node_id} in {[n.node_id for n in self.nodes]}")

    def _live_bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes if n.running()) or self.bootstrap

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until the metadata lists every running node as a broker; raise
        ServiceStartError (with the log of a dead or missing node) after ``timeout``."""
        deadline = time.monotonic() + timeout
        listed: set[int] = set()
        while True:
            for node in self.nodes:
                if node._process is not None and not node.running():
                    raise node.failure("died while the cluster started")
            wanted = {n.node_id for n in self.nodes if n.running()}
            # An open port first: a metadata request to a closed one only logs refusals.
            if all(_tcp_accepts(self.node(n).port) for n in wanted):
                try:
                    listed = kafka_lookup.in_thread(
                        lambda: kafka_lookup.listed_brokers(self._live_bootstrap()), 15.0)
                except Exception:  # not serving yet; the deadline bounds this
                    listed = set()
            if wanted <= listed:
                return
            if time.monotonic() >= deadline:
                missing = sorted(wanted - listed)
                raise self.node(missing[0]).failure(
                    f"was not listed in the metadata within {timeout:g}s (listed: "
                    f"{sorted(listed)})")
            time.sleep(_POLL)

    async def _until(self, lookup: Callable[[], Awaitable[int]], what: str,
                     timeout: float) -> KafkaNode:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            try:
                node_id = await lookup()
            except Exception as exc:  # an election in progress; bounded
                last = exc
            else:
                # A broker's metadata may still name a node just killed: not an answer yet.
                if node_id >= 0 and self.node(node_id).running():
                    return self.node(node_id)
                last = f"node {node_id}, not running" if node_id >= 0 else "none yet (-1)"
            await asyncio.sleep(_POLL)
        raise TimeoutError(f"no {what} within {timeout:g}s; last answer: {last!r}")

    async def leader(self, topic: str, partition: int = 0,
                     timeout: float = LOOKUP_TIMEOUT) -> KafkaNode:
        """The running node leading ``topic``'s ``partition`` (waits out an election)."""
        return await self._until(
            lambda: kafka_lookup.partition_leader(self._live_bootstrap(), topic, partition),
            f"leader of {topic}-{partition}", timeout)

    async def controller(self, timeout: float = LOOKUP_TIMEOUT) -> KafkaNode:
        """The node that is the active controller (the metadata quorum's leader)."""
        return await self._until(
            lambda: kafka_lookup.active_controller(self._live_bootstrap()),
            "active controller", timeout)

    async def coordinator(self, group_id: str, timeout: float = LOOKUP_TIMEOUT) -> KafkaNode:
        """The node coordinating consumer group ``group_id``."""
        return await self._until(
            lambda: kafka_lookup.group_coordinator(self._live_bootstrap(), group_id),
            f"coordinator of group {group_id}", timeout)

    def stop(self) -> None:
        """Kill every node and delete the cluster's directory (logs and data)."""
        atexit.unregister(self.stop)
        for node in self.nodes:
            node.kill()
            if node.proxy is not None:
                node.proxy.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _format(java: str, lib: Path, nodes: list[KafkaNode], cluster_id: str, log_opt: str,
            timeout: float, extra: Sequence[str] = ()) -> None:
    """Format every node's log dir (kafka.tools.StorageTool), the nodes in parallel; a node
    that fails is formatted once more (a JVM has exited 1 without a word on a busy machine)."""
    failed = _format_nodes(java, lib, nodes, cluster_id, log_opt, timeout, extra)
    if failed:
        again = [node for node in nodes if node.node_id in failed]
        failed = _format_nodes(java, lib, again, cluster_id, log_opt, timeout,
                               [*extra, "--ignore-formatted"])
    if failed:
        raise ServiceStartError("formatting Kafka's log dirs failed: " + "\n".join(
            failed.values()))


def _format_nodes(java: str, lib: Path, nodes: list[KafkaNode], cluster_id: str, log_opt: str,
                  timeout: float, extra: Sequence[str]) -> dict[int, str]:
    """Node id -> what went wrong, for the nodes whose format failed."""
    running = []
    for node in nodes:
        argv = [java, "-Xmx128m", "-XX:TieredStopAtLevel=1", log_opt, "-cp", f"{lib}/*",
                "kafka.tools.StorageTool", "format", "-t", cluster_id,
                "-c", str(node.home / "server.properties"), *extra]
        log = (node.home / "format.log").open("wb")
        running.append((node, log, subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)))
    deadline = time.monotonic() + timeout
    failed: dict[int, str] = {}
    for node, log, process in running:
        try:
            code = process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
        log.close()
        if code != 0:
            text = (node.home / "format.log").read_text(errors="replace")[-3000:]
            failed[node.node_id] = f"node {node.node_id} (exit {code}):\n{text}"
    return failed


def start_kafka(
    brokers: int = 3, version: str = DEFAULT_KAFKA_VERSION, timeout: float = READY_TIMEOUT,
    jvm_options: tuple[str, ...] = JVM_OPTIONS, security: KafkaSecurity | None = None,
    proxied: bool = False,
) -> KafkaCluster:
    """Start an Apache Kafka ``version`` cluster of ``brokers`` KRaft nodes (1 or 3) and wait
    until its metadata lists every broker. ``proxied``: every node advertises a
    :class:`TcpProxy` of this process in front of its client port (``node.proxy``).

    Three nodes: replication factor 3, ``min.insync.replicas=2``, unclean leader election off.
    One node: every replication factor 1. ``security`` adds a SASL_SSL listener with ACLs
    (:mod:`tests.harness.kafka_security`).
    """
    if brokers not in (1, 3):
        raise ValueError(f"start_kafka runs 1 or 3 brokers, not {brokers}")
    java, _ = require_tools(maven=False)
    lib = kafka_lib(version)
    for attempt in range(1, _PORT_ATTEMPTS + 1):
        try:
            return _launch(java, lib, brokers, version, timeout, jvm_options, security,
                           proxied)
        except ServiceStartError as exc:  # a free port taken before the node bound it
            if attempt == _PORT_ATTEMPTS or "Address already in use" not in str(exc):
                raise
    raise AssertionError("unreachable")


def _launch(java: str, lib: Path, brokers: int, version: str, timeout: float,
            jvm_options: tuple[str, ...], security: KafkaSecurity | None,
            proxied: bool = False) -> KafkaCluster:
    workdir = Path(tempfile.mkdtemp(prefix="consumerkit-kafka-"))
    log_opt = log_option(version, workdir)
    ids = list(range(1, brokers + 1))
    ports = {n: (free_port(), free_port()) for n in ids}
    if security is not None:
        security.prepare(workdir, {n: free_port() for n in ids})
    nodes = []
    for n in ids:
        home = workdir / f"node{n}"
        (home / "data").mkdir(parents=True)
        proxy = TcpProxy(ports[n][0]) if proxied else None
        properties = node_properties(n, ports, home / "data",
                                     proxy.port if proxy is not None else None)
        if security is not None:
            properties = security.node_properties(n, properties)
        (home / "server.properties").write_text(render_properties(properties))
        argv = [java, *jvm_options, log_opt, "-cp", f"{lib}/*", "kafka.Kafka",
                str(home / "server.properties")]
        nodes.append(KafkaNode(n, *ports[n], home, argv, proxy))
    cluster = KafkaCluster(version, workdir, nodes)
    try:
        _format(java, lib, nodes, new_cluster_id(), log_opt, timeout,
                security.format_arguments() if security is not None else ())
        for node in nodes:
            node.start()
        cluster.wait_ready(timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster
