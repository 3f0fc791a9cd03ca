"""docs/first-hour.md typed as a user types it, in an empty folder, with the ``consumerkit``
and ``python`` first on PATH (the checkout's, or a wheel's in a fresh virtual environment:
``scripts/test-wheel.sh`` runs this file by path, so nothing is imported from the checkout).

The page's ``bash`` blocks run line by line; a line marked ``# runs until Ctrl-C`` starts in
the background (each in its own terminal, for a user) and is waited for until it says it is
ready; ``set -a; . ./.env; set +a`` carries over to the lines after it, as in one terminal.
The page's ``python`` block is the file its ``python NAME.py`` line runs. At the end every
background command gets SIGTERM and must exit 0, and ``consumerkit dev`` must have removed
its ``.env``.

    python tests/docs/first_hour.py docs/first-hour.md WORKDIR
"""

from __future__ import annotations

import asyncio
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\w+)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
BACKGROUND = "# runs until Ctrl-C"
SHELL_STATE = "set -a; . ./.env; set +a"
READY = {"dev": "stop with Ctrl-C", "run": "assigned [", "relay": "started on"}
TIMEOUT = 120.0


@dataclass
class Line:
    text: str
    background: bool


def page_parts(page: Path) -> tuple[list[Line], dict[str, str]]:
    """The page's command lines, in order, and its file: the one ``python`` block, named
    as the page's ``python NAME.py`` line runs it."""
    lines: list[Line] = []
    code: list[str] = []
    for language, body in FENCE.findall(page.read_text()):
        if language == "python":
            code.append(body)
        elif language == "bash":
            lines += [Line(line.strip(), BACKGROUND in line)
                      for line in body.splitlines() if line.strip()]
    (script,) = [m.group(1) for line in lines
                 if (m := re.match(r"python (\w+\.py)\b", line.text)) is not None]
    (body,) = code
    return lines, {script: body}


class Session:
    """The user's terminals: one for each background command, one for the rest."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.prelude: list[str] = []
        self.background: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.outputs: list[tuple[str, subprocess.CompletedProcess[str]]] = []

    def run(self, line: Line) -> None:
        command = " ".join(shlex.split(line.text, comments=True))
        if command == SHELL_STATE:
            self.prelude.append(command)
            return
        if line.background:
            self._start(command)
            return
        done = subprocess.run(
            ["bash", "-c", "; ".join([*self.prelude, line.text])], cwd=self.folder,
            capture_output=True, text=True, timeout=TIMEOUT, check=False)
        print(f"$ {command}\n{done.stdout}{done.stderr}", flush=True)
        self.outputs.append((command, done))

    def _start(self, command: str) -> None:
        name = shlex.split(command)[1]
        log = self.folder.parent / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", "; ".join([*self.prelude, f"exec {command}"])],
                cwd=self.folder, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        self.background.append((name, proc, log))
        deadline = time.monotonic() + TIMEOUT
        while READY[name] not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{command} was not ready: {log.read_text()[-3000:]}")
            time.sleep(0.1)
        print(f"$ {command}  (ready)", flush=True)

    def stop(self) -> list[tuple[str, int | None, str]]:
        """SIGTERM to each background command, last started first; (name, exit, log)."""
        ended = []
        for name, proc, log in reversed(self.background):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                code: int | None = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = None
            ended.append((name, code, log.read_text(errors="replace")))
        return ended


async def _published(bootstrap: str, topic: str) -> bytes:
    from aiokafka import AIOKafkaConsumer

    reader = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await reader.start()
    try:
        async with asyncio.timeout(60):
            record = await reader.getone()
        value: bytes = record.value
        return value
    finally:
        await reader.stop()


def first_hour(page: Path, work: Path) -> None:
    """Run the page in ``work`` (created empty) and check what it says happens."""
    folder = work / "project"
    folder.mkdir(parents=True)
    lines, files = page_parts(page)
    session = Session(folder)
    try:
        for name, body in files.items():
            (folder / name).write_text(body)
        for line in lines:
            session.run(line)
        settings = dict(line.split("=", 1) for line in (folder / ".env").read_text().splitlines()
                        if not line.startswith("#"))
        bootstrap = settings["CONSUMERKIT_KAFKA_BOOTSTRAP"].strip("'")
        payment = asyncio.run(_published(bootstrap, "payment"))
    finally:
        ended = session.stop()
    said = [(command, done.returncode, done.stdout + done.stderr)
            for command, done in session.outputs]
    sends = [out for command, _, out in said if command.startswith("consumerkit send")]
    assert "billing: applied by billing.charge" in sends[0], sends
    assert "this one is a duplicate" in sends[1], sends
    assert "billing: dead-lettered: invalid_payload" in sends[2], sends
    (looked,) = [out for command, _, out in said if command.startswith("consumerkit lookup")]
    assert "billing: applied by billing.charge" in looked, looked
    (listed,) = [out for command, _, out in said if command.startswith("consumerkit dead-")]
    assert "invalid_payload" in listed, listed
    assert b'"order_id":"o-1"' in payment.replace(b" ", b"")
    # the one send the page expects to fail: its consumer dead-lettered the event
    failed = [(command, code) for command, code, out in said
              if code != 0 and "dead-lettered: invalid_payload" not in out]
    assert not failed, failed
    for name, code, log in ended:
        assert code == 0, f"{name} exited {code}: {log[-3000:]}"
        assert "Traceback" not in log, f"{name}: {log[-3000:]}"
    assert not (folder / ".env").exists(), "consumerkit dev left its .env behind"


if __name__ == "__main__":
    first_hour(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
    print("first hour: every command worked as the page says", file=sys.stderr)
