"""Every default the prose states is the code's default.

The tables of arguments are compared with the signatures in ``test_docs.py``; this file covers
sentences such as "`max_batch`, 500 by default" or "`timeouts.handler` (60 s by default)",
anywhere in the docs, the README and the docstrings of the public API.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from consumerkit import Consumer, DedupPolicy, RetryPolicy, WebhookReceiver
from consumerkit.dedup.redis import RedisDedupCache
from consumerkit.outbox import KafkaSink, Outbox, Relay
from consumerkit.settings.groups import GROUPS, Group
from consumerkit.transport.kafka import _CONSUMER_DEFAULTS as CONSUMER_DEFAULTS

ROOT = Path(__file__).resolve().parents[2]
TEXTS = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md",
         *sorted((ROOT / "consumerkit").rglob("*.py")),
         *sorted((ROOT / "tests" / "harness").rglob("*.py"))]  # they state defaults too

# "`name`" then, within one clause, "N by default", "(N ...)", "the default is N"
CLAIM = re.compile(
    r"``?(?:\w+\.)?(?P<name>\w+)``?[^`.;]{0,30}?(?:\(|, |the default is )(?:the default is )?"
    r"(?P<value>\d[\d ,]*(?:\.\d+)?)\s?(?P<unit>ms|s|MiB|hours?|days?)?(?= by default|\))")
BATCH_CLAIM = re.compile(r"batch of up to (\d+) (?:records|messages)")
UNITS: dict[str | None, Callable[[float], Any]] = {
    None: lambda n: n, "s": lambda n: n, "ms": lambda n: n / 1000, "MiB": lambda n: n * 2**20,
    "hour": lambda n: timedelta(hours=n), "hours": lambda n: timedelta(hours=n),
    "day": lambda n: timedelta(days=n), "days": lambda n: timedelta(days=n),
}


def code_defaults() -> dict[str, set[Any]]:
    """Every default of the public constructors, by argument name (a name may have several)."""
    found: dict[str, set[Any]] = {}
    for cls in (Consumer, Relay, KafkaSink, Outbox, RedisDedupCache, WebhookReceiver):
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if param.default is not inspect.Parameter.empty and not isinstance(
                    param.default, Group):  # a group's fields are below
                found.setdefault(name, set()).add(param.default)
    for data in (DedupPolicy, RetryPolicy):
        for f in dataclasses.fields(data):
            if f.default is not dataclasses.MISSING:
                found.setdefault(f.name, set()).add(f.default)
    for group in GROUPS.values():  # `limits.max_batch` states the default of `max_batch`
        for name, field in group.model_fields.items():
            if field.default_factory is None:
                found.setdefault(name, set()).add(field.default)
    for name, value in CONSUMER_DEFAULTS.items():
        found.setdefault(name, set()).add(value)
    return found


def same(default: Any, stated: Any) -> bool:
    if isinstance(default, timedelta) and not isinstance(stated, timedelta):
        return bool(default.total_seconds() == stated)
    return bool(default == stated)


def claims(text: str) -> Iterator[tuple[str, list[Any], str]]:
    """(name, the values the sentence may mean, the sentence) for each stated default."""
    for m in CLAIM.finditer(text):
        number = float(re.sub(r"[ ,]", "", m.group("value")))
        value = UNITS[m.group("unit")](number)
        if m.group("name").endswith("_ms"):  # a setting in milliseconds
            value = number * (1000 if m.group("unit") == "s" else 1)
        if text[:m.start()].endswith("half of "):  # "half of `x` (30 s by default)"
            yield m.group("name"), [value, value * 2], m.group(0)
        else:
            yield m.group("name"), [value], m.group(0)


def test_claims_are_found() -> None:
    stated = {name for path in TEXTS for name, _, _ in claims(path.read_text())}
    assert {"max_batch", "handler", "socket_timeout", "retry_interval",
            "max_poll_records", "rebalance_timeout_ms", "retention"} <= stated


@pytest.mark.parametrize("path", TEXTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_stated_defaults_match_the_code(path: Path) -> None:
    defaults = code_defaults()
    text = path.read_text()
    for name, value, quote in claims(text):
        if name in defaults:
            assert any(same(d, v) for d in defaults[name] for v in value), \
                f"{path.name}: {quote!r}, the code says {sorted(map(str, defaults[name]))}"
    for size in BATCH_CLAIM.findall(text):
        assert int(size) in defaults["max_batch"], f"{path.name}: a batch of up to {size}"


def test_a_wrong_default_is_caught() -> None:
    defaults = code_defaults()
    wrong = list(claims("With `max_batch` above 1 (the default is 100), records share"))
    assert wrong == [("max_batch", [100], "`max_batch` above 1 (the default is 100")]
    assert 100 not in defaults["max_batch"]
