"""Every setting, given as a flag or a variable, takes effect where the consumer's code left
the default, and ``config`` names its real source; a value the code passes wins, and the
warning says so. Parametrized over the settings models' fields: a new field is covered."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

import asyncpg
import pytest
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from consumerkit import Consumer
from consumerkit.cli import main
from consumerkit.cli.options import shown as shown_value
from consumerkit.cli.run import ARGUMENTS, UNSET_BY_NONE
from consumerkit.settings import SETTINGS, ConsumerSettings, env_name, flag
from consumerkit.shared.identifiers import redact_dsn
from consumerkit.testing.services import MakeTopic

from .app_consumer import charge
from .conftest import start, terminate, with_password
from .test_run import ORDERS, publish, wait_for

HERE = Path(__file__).parent
SECRET = "Sw0rd-s3cret"
DSN = f"postgresql://app:{SECRET}@db.example:5432/app"
CODE_DSN = "postgresql://code@db.example:5432/code"
TARGET = "app_defaults:build"
DEFAULTS = {p.name: p.default for p in inspect.signature(Consumer).parameters.values()}
"""The Consumer's arguments and their defaults."""


def _kind(field: FieldInfo) -> Any:
    """The field's type, ``None`` taken out of an optional one."""
    if get_origin(field.annotation) not in (Union, UnionType):
        return field.annotation
    [kind] = [a for a in get_args(field.annotation) if a is not type(None)]
    return kind


def given(name: str, field: FieldInfo) -> tuple[str, str]:
    """A valid value other than the default: as the flag's and as the variable's text."""
    kind = _kind(field)
    if get_origin(kind) is Literal:
        text = next(str(c) for c in get_args(kind) if c != field.default)
    elif kind is bool:
        text = "false" if field.default else "true"
    elif kind is int:
        text = "7"
    elif kind is float:
        text = "12.5"
    elif kind is SecretStr:
        text = DSN if name == "postgres_dsn" else SECRET
    elif get_origin(kind) is dict:
        return f"X-Token: {SECRET}", json.dumps({"X-Token": SECRET})
    elif get_origin(kind) is list and name == "ignore":  # event type patterns
        return "order.internal.*", "order.internal.*"
    elif get_origin(kind) is list:
        return f"whsec_{SECRET}", f"whsec_{SECRET}"
    else:
        text = "sample_value"
    return text, text


def shown(command: str, name: str, field: FieldInfo, text: str) -> str:
    """How ``config`` shows the value ``text`` gives the field (the DSN redacted, other
    secrets as ``**********``)."""
    kind = _kind(field)
    if kind is bool:
        return str(text == "true")
    if name == "postgres_dsn":
        return redact_dsn(text)
    if kind is SecretStr:
        return "**********"
    if get_origin(kind) is dict:
        return "{X-Token: **********}"
    if get_origin(kind) is list and name == "ignore":
        return f"[{text}]" if command == "relay" else f"('{text}',)"
    if get_origin(kind) is list:
        return "[**********]"
    return text


def code_value(argument: str) -> object:
    """What the code passes: the constructor's own default where it has one (passing it is
    still a choice), else a value of its own."""
    default = DEFAULTS[argument]
    if default is not None and argument not in UNSET_BY_NONE:
        return default
    return {"postgres_dsn": CODE_DSN, "kafka_bootstrap": "code.example:9092",
            "metrics_port": 9200, "concurrency": 2}[argument]


def flag_argv(name: str, field: FieldInfo, text: str) -> list[str]:
    if _kind(field) is bool:
        return [flag(name) if text == "true" else "--no-" + flag(name)[2:]]
    return [flag(name), text]


CASES = [(command, name, how) for command, model in SETTINGS.items()
         for name in model.model_fields
         for how in ("default", "flag", "env", "code")
         if how != "code" or (command == "run" and name in ARGUMENTS)]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory holding the consumer's module, as the current directory, and an
    environment without CONSUMERKIT_* variables."""
    shutil.copy(HERE / "app_defaults.py", tmp_path / "app_defaults.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "app_defaults", raising=False)
    for variable in [v for v in os.environ if v.startswith("CONSUMERKIT_")]:
        monkeypatch.delenv(variable)
    return tmp_path


@pytest.mark.parametrize(("command", "name", "how"), CASES,
                         ids=[f"{c}-{n}-{h}" for c, n, h in CASES])
def test_config_shows_each_settings_value_and_its_real_source(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    command: str, name: str, how: str,
) -> None:
    model = SETTINGS[command]
    field = model.model_fields[name]
    flag_text, env_text = given(name, field)
    argv = ["config", command, *([TARGET] if command == "run" else [])]
    if how in ("flag", "code"):
        argv += flag_argv(name, field, flag_text)
    if how == "env":
        monkeypatch.setenv(env_name(name), env_text)
    argument = ARGUMENTS.get(name, "")
    if how == "code":
        monkeypatch.setenv("CLI_TEST_CHOSEN", json.dumps({argument: code_value(argument)}))
    assert main(argv) == 0
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line.split(maxsplit=3) for line in out.splitlines()[1:]}
    label = "schema" if name == "db_schema" else name
    _, source, variable, value = rows[label]
    assert variable == env_name(name)
    assert SECRET not in out + err
    if how == "code":
        chosen = code_value(argument)
        assert (source, value) == ("code", "unset" if chosen is None else str(chosen))
        assert (f"{flag(name)} (flag) ignored: the consumer's code passes "
                f"{argument}={chosen!r}") in err
        return
    assert "ignored" not in err  # nothing the code chose was given
    assert source == how
    if how == "default":
        if command == "run" and argument:  # the consumer's own default
            default = getattr(Consumer(name="c", handlers=[charge], topics=["t"]), argument)
        else:
            default = getattr(model(), name)
        assert value == shown_value(default)
        assert value != shown(command, name, field, flag_text)  # so the other cases can fail
        return
    assert value == shown(command, name, field, flag_text if how == "flag" else env_text)


def test_every_consumer_argument_among_the_settings_is_configurable() -> None:
    """Each setting named after a Consumer argument is given to it: none is left out."""
    arguments = set(DEFAULTS)
    for name in ConsumerSettings.model_fields:
        argument = "schema" if name == "db_schema" else name
        assert (argument in arguments) == (name in ARGUMENTS), name


async def test_run_takes_the_schema_flag_and_the_batch_variable_the_code_left_default(
    tmp_path: Path, postgres_dsn: str, kafka_bootstrap: str, make_topic: MakeTopic,
    pg_schema: str, pg_pool: asyncpg.Pool,
) -> None:
    shutil.copy(HERE / "app_defaults.py", tmp_path / "app_defaults.py")
    topic = await make_topic(1)
    await pg_pool.execute(f'CREATE SCHEMA "{pg_schema}"')
    await pg_pool.execute(f'CREATE TABLE "{pg_schema}".charges (order_id text NOT NULL, '
                          'amount int NOT NULL)')
    await publish(kafka_bootstrap, topic, ORDERS)  # in one fetch: batches can fill
    env = {"CLI_TEST_SCHEMA": pg_schema, "CLI_TEST_TOPIC": topic,
           "CLI_TEST_GROUP": f"cli-{uuid.uuid4().hex[:8]}",
           "CONSUMERKIT_POSTGRES_DSN": with_password(postgres_dsn),
           "CONSUMERKIT_MAX_BATCH": "50"}
    proc = await start("run", TARGET, "--kafka", kafka_bootstrap, "--schema", pg_schema,
                       cwd=tmp_path, env=env)
    try:
        await wait_for(pg_pool, f'SELECT count(*) FROM "{pg_schema}".charges', ORDERS)
    finally:
        done = await terminate(proc)
    assert done.code == 0, done.err
    assert "ignored" not in done.err
    # the consumer's own tables are in the schema of the flag, not in "consumerkit"
    transactions = await pg_pool.fetchval(
        f'SELECT count(*) FROM "{pg_schema}".processed_events')
    # with max_batch 1 (the code's default would be 500, the variable says 50) every record
    # would have a dedup row of its own; batches share one per transaction
    assert 0 < transactions < ORDERS
