"""``examples/embedded_services.py`` prints the variables that are read, under their names.

The command line, the examples and the demo's workers read ``CONSUMERKIT_*``; the test suite
reads ``CONSUMERKIT_TEST_*``. Every name read anywhere must be one the example prints (it also
prints ``CONSUMERKIT_REDIS_URL``, the settings' name for the ``redis_url`` of a cache).
"""

from __future__ import annotations

import re
from pathlib import Path

from examples.embedded_services import exports

ROOT = Path(__file__).resolve().parents[2]
READ = re.compile(r"""(?:environ\[|environ\.get\(|getenv\()\s*["'](CONSUMERKIT_\w+)["']""")
CONSTANT = re.compile(r"""^\w+_ENV = ["'](CONSUMERKIT_\w+)["']""", re.MULTILINE)


def names_read() -> set[str]:
    files = [*ROOT.joinpath("consumerkit").rglob("*.py"), *ROOT.joinpath("examples").glob("*.py"),
             ROOT / "tests" / "conftest.py", ROOT / "tests" / "brokers.py"]
    found: set[str] = set()
    for path in files:
        text = path.read_text()
        found |= set(READ.findall(text)) | set(CONSTANT.findall(text))
    return found


def test_the_example_prints_every_variable_that_is_read() -> None:
    printed = {re.match(r"export (\w+)=", line).group(1)  # type: ignore[union-attr]
               for line in exports("127.0.0.1:9092", "postgresql://p@h/d", "redis://h:6379/0")}
    read = names_read()
    assert {"CONSUMERKIT_POSTGRES_DSN", "CONSUMERKIT_KAFKA_BOOTSTRAP",
            "CONSUMERKIT_TEST_POSTGRES_DSN"} <= read
    # the example prints where the services are; other settings (the schema, say) are read
    # too, and each of those is in the configuration reference
    # (the Apache Kafka test cluster's variables are on its page)
    settings = {name for page in ("configuration.md", "kafka.md")
                for name in re.findall(r"CONSUMERKIT_\w+", (ROOT / "docs" / page).read_text())}
    assert read - printed <= settings - {"CONSUMERKIT_POSTGRES_DSN", "CONSUMERKIT_KAFKA_BOOTSTRAP"}
    assert {"CONSUMERKIT_POSTGRES_DSN", "CONSUMERKIT_KAFKA_BOOTSTRAP",
            "CONSUMERKIT_REDIS_URL"} <= printed


def test_the_values_are_quoted_for_the_shell() -> None:
    line = exports("k:1", "postgresql://p@/d?host=/tmp/x&port=5", "r")[1]
    assert line == "export CONSUMERKIT_POSTGRES_DSN='postgresql://p@/d?host=/tmp/x&port=5'"
