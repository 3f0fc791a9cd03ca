"""The AsyncAPI project's own parser (``@asyncapi/parser`` from npm), run with node.

The node project beside this file (package.json and its lock) is installed once per lock into
a cache directory outside the repository (``$CONSUMERKIT_NODE_CACHE``, default
``~/.cache/consumerkit/asyncapi-parser``) with ``npm ci``; where node or npm is missing the
tests that need it skip with that reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
FILES = ("package.json", "package-lock.json", "validate.mjs")
ERROR = 0  # DiagnosticSeverity.Error


@dataclass(frozen=True)
class Verdict:
    exit_code: int
    diagnostics: list[dict[str, Any]]

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [d for d in self.diagnostics if d["severity"] == ERROR]


class AsyncApiParser:
    def __init__(self, node: str, project: Path) -> None:
        self.node = node
        self.project = project

    def validate(self, document: Path) -> Verdict:
        done = subprocess.run(
            [self.node, str(self.project / "validate.mjs"), str(document)],
            capture_output=True, text=True, timeout=120, check=False)
        if done.returncode not in (0, 1):
            raise AssertionError(f"the parser crashed ({done.returncode}): {done.stderr}")
        lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        return Verdict(done.returncode, lines)


def install() -> AsyncApiParser:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed to run the AsyncAPI parser (@asyncapi/parser)")
    digest = hashlib.sha256(b"".join((HERE / f).read_bytes() for f in FILES)).hexdigest()[:16]
    root = Path(os.environ.get("CONSUMERKIT_NODE_CACHE")
                or Path.home() / ".cache" / "consumerkit" / "asyncapi-parser")
    project = root / digest
    if not (project / "node_modules" / "@asyncapi" / "parser").is_dir():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=root, prefix="install-"))
        for name in FILES:
            shutil.copy(HERE / name, staging / name)
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
            cwd=staging, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            raise AssertionError(f"npm ci of @asyncapi/parser failed: {done.stderr[-2000:]}")
        try:
            staging.rename(project)  # atomic: a concurrent install that won keeps its copy
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
    return AsyncApiParser(node, project)
