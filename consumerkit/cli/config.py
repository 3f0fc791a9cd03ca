"""``consumerkit config run [MODULE:ATTR]`` / ``consumerkit config relay``: the effective
settings, secrets redacted, and where each value came from (flag, env, the ``.env`` file,
default, or the consumer's code: a field it gives a group, ``Limits(max_batch=100)``)."""

from __future__ import annotations

import argparse

from ..settings import SETTINGS, CommonSettings, ConsumerSettings, env_name, settings_fields, value
from ..settings.precedence import resolve, shown
from .common import HelpFormatter
from .options import add_settings_arguments, load_settings, sources
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
    values = {name: value(settings, name) for name, _ in settings_fields(model)}
    if getattr(args, "target", None):
        assert isinstance(settings, ConsumerSettings)
        consumer = await load_consumer(args.target)
        options, origin = resolve(consumer.options(), settings, origin)
        for name in values:  # the consumer's values, whatever their source
            group, dot, field = name.partition(".")
            if dot and group in options:
                values[name] = getattr(options[group], field)
            elif name in options:
                values[name] = options[name]
    width = max(len(n) for n in values)
    wide = max(len(env_name(n)) for n in values)
    print(f"{'setting':<{width}}  {'source':<8}  {'variable':<{wide}}  value")
    for name, found in values.items():
        text = shown(found, dsn=name == "postgres.dsn")
        print(f"{name:<{width}}  {origin[name]:<8}  {env_name(name):<{wide}}  {text}")
    return 0
