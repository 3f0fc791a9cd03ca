"""A user's type checker sees the groups as the docs use them: ``mypy --strict`` without
pydantic's plugin (the common case) takes a plain-text DSN, password or pattern list, knows
every field's default, and refuses a value of the wrong type."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import consumerkit.settings.groups as groups_module
from consumerkit.settings.groups import GROUPS

USER_CODE = '''\
from consumerkit import Kafka, Limits, Metrics, Postgres, Stall, Timeouts, Unhandled

postgres = Postgres(dsn="postgresql://app:secret@db:5432/app", schema="billing",
                    pooler="transaction", listen_dsn="postgresql://app:secret@db-direct/app")
kafka = Kafka(bootstrap="kafka:9092", security_protocol="SASL_SSL",
              sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="billing",
              sasl_plain_password="secret", ssl_cafile="/etc/ca.pem",
              options={"client_id": "billing"})
defaults = (Postgres(), Kafka(), Limits(), Timeouts(), Stall(), Metrics(), Unhandled())
limits = Limits(max_batch=100, concurrency=8)
timeouts = Timeouts(handler=10.0, shutdown=30)
stall = Stall(after_keys=0)
metrics = Metrics(port=9100)
unhandled = Unhandled(ignore=["order.internal.*"])
skipped = Unhandled(policy="skip", ignore="order.internal.*")
'''

BAD_CODE = '''\
from consumerkit import Limits, Postgres

Limits(max_batch="100")
Postgres(pooler="statement")
'''


def test_user_code_type_checks_without_the_pydantic_plugin(tmp_path: Path) -> None:
    (tmp_path / "user.py").write_text(USER_CODE)
    (tmp_path / "bad.py").write_text(BAD_CODE)
    (tmp_path / "mypy.ini").write_text("[mypy]\nstrict = True\n")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir",
         str(tmp_path / "cache"), "user.py", "bad.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[0:2] for line in errors] == [["bad.py", "3"], ["bad.py", "4"]], \
        done.stdout
    assert '"max_batch" to "Limits" has incompatible type "str"' in errors[0]
    assert '"pooler" to "Postgres" has incompatible type' in errors[1]


def _typed_inits() -> dict[str, list[str]]:
    """The keyword arguments of each group's ``__init__`` written for type checkers."""
    tree = ast.parse(Path(groups_module.__file__).read_text())
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        for statement in node.body:
            if isinstance(statement, ast.If) and ast.unparse(statement.test) == "TYPE_CHECKING":
                (init,) = statement.body
                assert isinstance(init, ast.FunctionDef)
                assert init.name == "__init__"
                found[node.name] = [a.arg for a in init.args.kwonlyargs]
    return found


def test_each_typed_init_names_its_groups_fields_in_order() -> None:
    inits = _typed_inits()
    assert set(inits) == {"Postgres", "Kafka", "Unhandled"}  # the groups with a wider input
    for group in GROUPS.values():
        if group.__name__ in inits:
            assert inits[group.__name__] == list(group.model_fields), group.__name__
