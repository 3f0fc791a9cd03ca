"""docs/testing.md as it stands: its Python snippets, put together in the order the page
shows them, are a test module that pytest runs in a project of its own (a fresh folder with
the page's pytest setting, consumerkit's plugin from its entry point, none of this suite's
conftest), and every test in it passes. A snippet that misses an import, or a helper the page
does not show, fails here."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [m.group(2) for m in FENCE.finditer(PAGE.read_text()) if m.group(1) == language]


def page_module() -> str:
    return "\n\n".join(blocks("python"))


def test_the_pip_line_names_what_the_tests_need() -> None:
    (line,) = [b.strip() for b in blocks("bash") if b.startswith("pip install")]
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["project"]["optional-dependencies"])
    packages = line.split()[2:]
    assert packages[0].strip("'") == "consumerkit[embedded]"
    assert "embedded" in extras
    assert set(packages[1:]) == {"pytest", "pytest-asyncio"}
    (setting,) = blocks("toml")
    assert tomllib.loads(setting)["tool"]["pytest"]["ini_options"]["asyncio_mode"] == "auto"


@pytest.mark.slow
def test_the_pages_snippets_run_as_a_test_module(postgres_dsn: str, tmp_path: Path) -> None:
    source = page_module()
    tests = [node.name for node in ast.parse(source).body
             if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef)
             and node.name.startswith("test_")]
    assert len(tests) >= 6
    (tmp_path / "test_page.py").write_text(source)
    (tmp_path / "pyproject.toml").write_text(blocks("toml")[0])  # the page's pytest setting
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUMERKIT_")}
    env |= {"CONSUMERKIT_TEST_POSTGRES_DSN": postgres_dsn,  # this session's server
            "PYTHONPATH": str(ROOT)}  # the page's handlers are the examples'
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_page.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(tests)} passed" in result.stdout, result.stdout
