"""Every setting, given as a flag or a variable, takes effect where the consumer's code left
the default, and ``config`` names its real source; a value the code passes wins, and the
warning says so. Parametrized over the settings models' fields: a new field is covered."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import asyncpg
import pytest
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from consumerkit import Consumer
from consumerkit.cli import main
from consumerkit.engine.options import DEFAULTS
from consumerkit.settings import (
    CONSUMER_GROUPS,
    SETTINGS,
    ConsumerSettings,
    env_name,
    flag,
    settings_fields,
    value,
)
from consumerkit.settings.precedence import shown as shown_value
from consumerkit.shared.identifiers import redact_dsn
from consumerkit.testing.services import MakeTopic

from .conftest import start, terminate, with_password
from .test_run import ORDERS, publish, wait_for

HERE = Path(__file__).parent
SECRET = "Sw0rd-s3cret"
DSN = f"postgresql://app:{SECRET}@db.example:5432/app"
CODE_DSN = "postgresql://code@db.example:5432/code"
TARGET = "app_defaults:build"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
OWN = {"postgres.dsn": CODE_DSN, "kafka.bootstrap": "code.example:9092", "metrics.port": 9200,
       "limits.concurrency": 2, "kafka.sasl_mechanism": "SCRAM-SHA-256",
       "kafka.sasl_plain_username": "code-user", "kafka.sasl_plain_password": "code-secret",
       "postgres.listen_dsn": "postgresql://code@db.example:5432/listen",
       "kafka.ssl_cafile": CA_BUNDLE, "kafka.ssl_keyfile": "code-key.pem",
       "kafka.ssl_password": "code-secret"}
"""What the code gives where the default is unset: a value of its own."""
CODE_CHOSEN = {"kafka.consumer_options"}  # the app's code always gives it
NO_FLAG = {"kafka.options", "kafka.consumer_options"}  # a mapping: its variable alone
NO_CODE = {"kafka.ssl_certfile"}  # the code's certificate would be loaded: it needs a real one


def _kind(field: FieldInfo) -> Any:
    """The field's type, ``None`` taken out of an optional one."""
    kind = field.annotation
    if get_origin(kind) in (Union, UnionType):
        [kind] = [a for a in get_args(kind) if a is not type(None)]
    return get_args(kind)[0] if get_origin(kind) is Annotated else kind


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
        text = DSN if name == "postgres.dsn" else SECRET
    elif get_origin(kind) is dict and name.startswith("kafka."):  # client options
        return "", json.dumps({"client_id": "sample_value"})
    elif get_origin(kind) is dict:
        return f"X-Token: {SECRET}", json.dumps({"X-Token": SECRET})
    elif get_origin(kind) is tuple:  # event type patterns
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
    if name == "postgres.dsn":
        return redact_dsn(text)
    if kind is SecretStr:
        return "**********"
    if get_origin(kind) is dict and name.startswith("kafka."):
        return "{client_id: sample_value}"
    if get_origin(kind) is dict:
        return "{X-Token: **********}"
    if get_origin(kind) is tuple:
        return f"[{text}]"
    if get_origin(kind) is list:
        return "[**********]"
    return text


def code_value(name: str, field: FieldInfo) -> object:
    """What the code gives: the group's own default where it has one (giving it is still a
    choice), else a value of its own."""
    if field.default is not None and name not in OWN:
        return list(field.default) if isinstance(field.default, tuple) else field.default
    return OWN[name]


def code_json(name: str, chosen: object) -> str:
    """``CLI_TEST_CHOSEN`` for the app's code to give ``chosen`` to setting ``name``."""
    group, dot, field = name.partition(".")
    return json.dumps({group: {field: chosen}} if dot else {name: chosen})


def flag_argv(name: str, field: FieldInfo, text: str) -> list[str]:
    if _kind(field) is bool:
        return [flag(name) if text == "true" else "--no-" + flag(name)[2:]]
    return [flag(name), text]


def consumer_option(name: str) -> bool:
    """Whether the setting is one of a consumer's options (in code too)."""
    return name.split(".")[0] in CONSUMER_GROUPS or name == "offset_store"


CASES = [(command, name, how) for command, model in SETTINGS.items()
         for name, _ in settings_fields(model) if name not in CODE_CHOSEN
         for how in ("default", "flag", "env", "code")
         if (how != "code" or (command == "run" and consumer_option(name)
                               and name not in NO_CODE))
         and not (how in ("flag", "code") and name in NO_FLAG)]


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
    field = dict(settings_fields(model))[name]
    flag_text, env_text = given(name, field)
    argv = ["config", command, *([TARGET] if command == "run" else [])]
    if how in ("flag", "code"):
        argv += flag_argv(name, field, flag_text)
    if how == "env":
        monkeypatch.setenv(env_name(name), env_text)
    if how == "code":
        chosen = code_value(name, field)
        monkeypatch.setenv("CLI_TEST_CHOSEN", code_json(name, chosen))
    assert main(argv) == 0
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line.split(maxsplit=3) for line in out.splitlines()[1:]}
    _, source, variable, shown_text = rows[name]
    assert variable == env_name(name)
    assert SECRET not in out + err
    if how == "code":
        text = shown_value(SecretStr(str(chosen)) if _kind(field) is SecretStr else chosen,
                           dsn=name == "postgres.dsn")
        assert (source, shown_text) == ("code", text)
        assert (f"{flag(name)} (flag) ignored: the consumer's code gives {name}={text}"
                in err)
        return
    assert "ignored" not in err  # nothing the code chose was given
    assert source == how
    if how == "default":
        assert shown_text == shown_value(value(model(), name))
        assert shown_text != shown(command, name, field, env_text)  # the other cases can fail
        return
    assert shown_text == shown(command, name, field, flag_text if how == "flag" else env_text)


def test_the_consumers_groups_are_the_settings_groups() -> None:
    """Each group a Consumer takes is a settings group of ``run``, of the same model: no
    option of the consumer is left out of the settings."""
    assert set(CONSUMER_GROUPS) == set(DEFAULTS)
    for name, group in DEFAULTS.items():
        assert ConsumerSettings.model_fields[name].annotation is type(group), name
    assert set(ConsumerSettings().options()) <= set(Consumer.__init__.__code__.co_varnames)


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
           "CONSUMERKIT_LIMITS_MAX_BATCH": "50"}
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
