"""A fail-point armed from outside kills its process when, and only when, it is passed."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from .procs import ROOT, Proc
from .zombie import stopped_within

# passes "before_commit" over and over; "after_claim" never
LOOP = """
import time
from consumerkit.shared import faults
print("ready", flush=True)
for _ in range(3000):
    faults.inject("before_commit")
    time.sleep(0.01)
"""


def probe(tmp_path: Path) -> Proc:
    arm = tmp_path / "probe.arm"
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "CONSUMERKIT_TORTURE": json.dumps({"arm_file": str(arm)})}
    proc = Proc("probe", [sys.executable, "-c", LOOP], env, tmp_path / "probe.log", arm)
    proc.start()
    deadline_reads = 0
    while "ready" not in proc.log.read_text():
        assert proc.running(), proc.log.read_text()
        assert deadline_reads < 3000, "the probe did not start"
        deadline_reads += 1
        proc.died_within(0.01)
    return proc


def test_an_armed_point_kills_the_process_that_passes_it(tmp_path: Path) -> None:
    proc = probe(tmp_path)
    try:
        proc.arm("after_claim")  # a point it never passes: it lives on
        assert not proc.died_within(0.5)
        proc.arm("before_commit")
        assert proc.died_within(10)
        assert proc.popen is not None
        assert proc.popen.returncode == -9  # SIGKILL: no clean-up ran
    finally:
        proc.kill()


def test_a_disarmed_point_does_nothing(tmp_path: Path) -> None:
    proc = probe(tmp_path)
    try:
        proc.arm("")
        assert not proc.died_within(0.5)
    finally:
        proc.kill()


def test_a_point_armed_to_stop_freezes_the_process_once(tmp_path: Path) -> None:
    """``name:stop``: a zombie in the middle of its work, until SIGCONT; then it goes on
    past the point, which no longer stops it."""
    proc = probe(tmp_path)
    try:
        proc.arm("before_commit:stop")
        assert stopped_within(proc.pid, 10)
        proc.signal(signal.SIGCONT)
        assert not proc.died_within(0.5)
        assert not stopped_within(proc.pid, 0.5)
    finally:
        proc.kill()
