"""``consumerkit config run [MODULE:ATTR]`` / ``consumerkit config relay``: the effective
settings, secrets redacted, and where each value came from (flag, env, the ``.env`` file,
default, or the consumer's code: an argument it passes to ``Consumer(...)``)."""

from __future__ import annotations

import argparse

from ..settings import SETTINGS, CommonSettings, ConsumerSettings, env_name
from ..shared.identifiers import redact_dsn
from .common import HelpFormatter
from .options import add_settings_arguments, load_settings, shown, sources
from .run import ARGUMENTS, settle_settings
from .target import load_consumer


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "config", help="print the effective settings of run or relay, secrets redacted",
        description=__doc__, formatter_class=HelpFormatter)
    which = parser.add_subparsers(dest="runnable", required=True, metavar="run|relay")
    for name, model in SETTINGS.items():
        runnable = which.add_parser(name, help=f"the settings of consumerkit {name}",
                                    formatter_class=HelpFormatter)
        if name == "run":
            runnable.add_argument(
                "target", metavar="MODULE:ATTR", nargs="?", default=None,
                help="the consumer: its code's values are shown where they win")
        add_settings_arguments(runnable, model)
        runnable.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                              help="show the traceback of an error (default: off)")
    parser.set_defaults(handler=config_command)


async def config_command(args: argparse.Namespace) -> int:
    model: type[CommonSettings] = SETTINGS[args.runnable]
    settings = load_settings(args, model)
    origin = sources(args, model)
    values = {name: shown(getattr(settings, name)) for name in model.model_fields}
    if settings.postgres_dsn is not None:  # its host and database help; its password not
        values["postgres_dsn"] = redact_dsn(settings.postgres_dsn.get_secret_value())
    if getattr(args, "target", None):
        assert isinstance(settings, ConsumerSettings)
        consumer = await load_consumer(args.target)
        origin.update(settle_settings(consumer, settings, origin))
        for name, argument in ARGUMENTS.items():  # the consumer's values, whatever their source
            value = getattr(consumer, argument)
            values[name] = redact_dsn(value) if name == "postgres_dsn" and value else shown(value)
    width = max(len(n) for n in values)
    print(f"{'setting':<{width}}  {'source':<8}  {'variable':<36}  value")
    for name, value in values.items():
        label = "schema" if name == "db_schema" else name
        print(f"{label:<{width}}  {origin[name]:<8}  {env_name(name):<36}  {value}")
    return 0
