"""docs/webhooks.md restates the code in tables: the arguments of both sides with their
defaults, the headers, and every response code of the receiver. These tests keep them equal."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path

from consumerkit import Postgres, Timeouts, WebhookReceiver, WebhookSink
from consumerkit.shared.webhook import headers as wh
from consumerkit.shared.webhook import signature

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "webhooks.md").read_text()
CODE = ROOT / "consumerkit"
UNREACHABLE_REASONS = {
    "empty_value",  # a request always has a body, if an empty one (invalid_json)
    "invalid_timestamp",  # the record time is the arrival time, never out of range
}


def section(heading: str) -> str:
    start = PAGE.index(f"\n{heading}\n")
    end = PAGE.find("\n#", start + 1)
    return PAGE[start:end if end >= 0 else len(PAGE)]


def rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[2:]]


def arguments_table(heading: str, follows: str) -> dict[str, str]:
    """``{argument: default cell}`` of the first table after ``follows`` in ``heading``."""
    text = section(heading)
    return {re.findall(r"`([^`]+)`", r[0])[0]: r[1] for r in rows(text[text.index(follows):])
            if r[0].startswith("`")}


def check_arguments(documented: dict[str, str], func: Callable[..., object]) -> None:
    params = {name: p for name, p in inspect.signature(func).parameters.items()
              if name != "self"}
    assert set(documented) == set(params)
    for name, cell in documented.items():
        expected = params[name].default
        if cell == "required":
            assert expected is inspect.Parameter.empty, name
        else:
            assert default(cell.strip("`")) == expected, name


def default(text: str) -> object:
    """A default cell's value: a literal, or an option group (``Timeouts(handler=30.0)``)."""
    call = ast.parse(text, mode="eval").body
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
        group = {"Postgres": Postgres, "Timeouts": Timeouts}[call.func.id]
        return group(**{k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg})
    return ast.literal_eval(text)


def test_the_argument_tables_match_the_signatures() -> None:
    check_arguments(arguments_table("## Sending: `WebhookSink`", "| argument"),
                    WebhookSink.__init__)
    check_arguments(arguments_table("## Receiving: `WebhookReceiver`", "| argument"),
                    WebhookReceiver.__init__)


def test_the_header_table_lists_every_header_the_sink_sets() -> None:
    documented = {r[0].strip("`") for r in rows(section("### The request"))}
    sent = {wh.IDEMPOTENCY_KEY, wh.EVENT_TYPE, wh.OCCURRED_AT, wh.AGGREGATE_TYPE,
            wh.AGGREGATE_ID, wh.ATTEMPT, "Content-Type", f"{wh.PREFIX}<Name>",
            *signature.HEADERS}
    assert documented == sent


def _text(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _receiver_codes() -> set[str]:
    """``status`` values and ``error`` codes the receiver module answers with."""
    codes: set[str] = set()
    modules = ("receiver.py", "_deliveries.py", "_answers.py")
    trees = [ast.parse((CODE / "webhook" / name).read_text()) for name in modules]
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if key is not None and _text(key) == "status" and _text(value):
                    codes.add(str(_text(value)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
            func = node.func
            if isinstance(func, ast.Attribute) and ast.unparse(func.value) == "log":
                continue  # log.error(...) is no answer
            name = func.attr if isinstance(func, ast.Attribute) else func.id
            position = {"error": 0, "refuse": 2, "unavailable": 1}.get(name)
            if position is not None and (code := _text(node.args[position])):
                codes.add(code)
    signing = ast.parse((CODE / "shared" / "webhook" / "signature.py").read_text())
    for node in ast.walk(signing):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "Rejection" and (code := _text(node.args[0]))):
            codes.add(code)
    decode = ast.parse((CODE / "engine/decode.py").read_text())
    for node in ast.walk(decode):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "DecodeError" and (code := _text(node.args[0]))):
            codes.add(code)
    return codes - UNREACHABLE_REASONS


def test_the_responses_table_lists_every_code_the_receiver_answers_with() -> None:
    documented = {code for r in rows(section("### Responses"))
                  for code in re.findall(r'"?([a-z_]+)"?', " ".join(re.findall(r"`([^`]+)`",
                                                                                 r[1])))
                  if code not in ("status", "error")}
    in_code = _receiver_codes()
    assert {"applied", "duplicate", "in_progress", "oversized", "invalid_json"} <= in_code
    assert documented == in_code
