"""The documentation and its examples cannot drift apart.

Every file under ``examples/`` is imported and the handlers and consumers it defines are built;
every ```python (and ```json) block in ``docs/**/*.md`` must appear verbatim in an example
file; every relative link must reach an existing file, and its anchor a heading there;
the tables that restate code (Consumer defaults, Kafka settings, dead-letter reasons,
statistics, loggers, migration steps, CLI commands and options) are compared with the code.
None of these tests needs a service.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import json
import logging
import re
import unicodedata
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, cast
from uuid import UUID

import pytest

from consumerkit import (
    Consumer,
    ConsumerStats,
    DeadLetter,
    DeadLetterTable,
    DeadLetterTopic,
    Envelope,
    HandlerContext,
    Record,
    RetryPolicy,
    WireFormat,
)
from consumerkit.cli import _parser, duration
from consumerkit.cli import main as cli_main
from consumerkit.engine.cdc import HEADERS_HEADER
from consumerkit.engine.decode import Decoder
from consumerkit.errors import ConfigurationError, is_retriable
from consumerkit.outbox import OutboxRetention, OutboxTable
from consumerkit.outbox.debezium import (
    CONNECTION_KEYS,
    deployment_settings,
    event_router_config,
)
from consumerkit.parking.tables import STEPS as PARKING_STEPS
from consumerkit.route_table import RouteTable
from consumerkit.schema import CORE_STEPS, DEDUP_STEPS
from consumerkit.settings import CONSUMER_GROUPS
from consumerkit.settings.groups import GROUPS
from consumerkit.settings.reference import render as render_reference
from consumerkit.transport import kafka as kafka_transport

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
PACKAGE = ROOT / "consumerkit"
PAGES = sorted(DOCS.rglob("*.md"))
EXAMPLE_FILES = sorted(p for p in EXAMPLES.iterdir()
                       if p.suffix in (".py", ".json") and p.name != "__init__.py")
EXAMPLE_MODULES = [p.stem for p in EXAMPLE_FILES if p.suffix == ".py"]
# every file under examples/, the service's folder included: the snippets' sources
EXAMPLE_SOURCES = sorted(p for p in EXAMPLES.rglob("*")
                         if p.is_file() and "__pycache__" not in p.parts)
HANDLER_MODULES = [p.stem for p in EXAMPLE_FILES if p.suffix == ".py"
                   and re.search(r"^@(\w+\.)?handler\(", p.read_text(), re.MULTILINE)]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
# a relative link: [text](path), [text](path#anchor) or [text](#anchor)
LINK = re.compile(r"\]\(([^)#\s:]*)(?:#([^)\s]*))?\)")
EXPECTED_PAGES = {
    "index.md", "guarantees.md", "handlers.md", "consumer.md", "dedup.md",
    "ordering-and-offsets.md", "failures.md", "wire-format.md", "outbox.md",
    "webhooks.md", "benchmarks.md", "configuration.md", "security.md",
    "demo.md", "observability.md", "operations/index.md", "testing.md",
    "operations/metrics.md", "operations/alerts.md", "operations/runbooks.md", "parking.md",
    "torture.md", "torture-long.md", "service.md", "deployment.md", "event-versions.md",
    "asyncapi.md", "failover.md", "kafka.md", "install.md", "first-hour.md", "scale.md",
}
KAFKA = "127.0.0.1:9092"
DSN = "postgresql://app@db.invalid/app"


def page(name: str) -> str:
    return (DOCS / name).read_text()


def name(path: Path) -> str:
    """A page's name: its path under docs/, such as ``operations/index.md``."""
    return path.relative_to(DOCS).as_posix()


def links(path: Path) -> list[tuple[Path, str]]:
    """(resolved target, anchor) of every relative link on the page ``path``."""
    return [((path.parent / target).resolve() if target else path, anchor)
            for target, anchor in LINK.findall(path.read_text())]


def is_page(target: Path) -> bool:
    return target.is_relative_to(DOCS) and target.suffix == ".md"


def code_blocks(language: str) -> list[tuple[str, str]]:
    """(page name, block text) for every fenced block of ``language`` in the docs."""
    return [(name(p), m.group(2)) for p in PAGES for m in FENCE.finditer(p.read_text())
            if m.group(1) == language]


def section(text: str, heading: str) -> str:
    """The text of the ``## heading`` section (up to the next ``## ``)."""
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def table_rows(text: str) -> list[list[str]]:
    """The cells of every markdown table row in ``text``, header and ruler rows excluded."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in text.splitlines() if line.startswith("|")]
    return [r for r in rows[2:] if not set("".join(r)) <= set("-: ")] if rows else []


def first_code(cell: str) -> str:
    match = re.match(r"`([^`]+)`", cell)
    assert match, f"expected a `code` cell, got {cell!r}"
    return match.group(1)


def slug(heading: str) -> str:
    """Python-Markdown's default heading id (what mkdocs links to)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def example(name: str) -> ModuleType:
    return importlib.import_module(f"examples.{name}")


# -- pages and links ---------------------------------------------------------------------------

def test_every_page_exists_and_the_index_links_them_all() -> None:
    # the API reference (reference/) is generated from the docstrings and has a nav of its own
    assert {name(p) for p in PAGES if not name(p).startswith("reference/")} == EXPECTED_PAGES
    linked = {name(target) for target, _ in links(DOCS / "index.md")
              if is_page(target) and not name(target).startswith("reference/")}
    assert linked == EXPECTED_PAGES - {"index.md"}


def test_every_link_between_pages_has_a_target() -> None:
    anchors = {p: {slug(h) for h in re.findall(r"^#+ (.+)$", p.read_text(), re.MULTILINE)}
               for p in PAGES}
    for p in PAGES:
        for target, anchor in links(p):
            if not is_page(target):
                continue
            assert target in anchors, f"{name(p)} links to missing page {target}"
            if anchor:
                assert anchor in anchors[target], f"{name(p)} links to {name(target)}#{anchor}"


def test_every_link_out_of_the_docs_has_a_target() -> None:
    found = 0
    for p in PAGES:
        for target, _ in links(p):
            if not is_page(target):  # a file in the repository, such as a rule file
                found += 1
                assert target.exists(), f"{name(p)} links to missing {target}"
    assert found  # the benchmarks are linked


def test_the_index_lists_every_example_file() -> None:
    index = page("index.md")
    for path in EXAMPLE_FILES:
        assert f"`examples/{path.name}`" in index, f"{path.name} is missing from docs/index.md"


# -- snippets are examples ---------------------------------------------------------------------

def test_every_python_block_is_copied_from_an_example() -> None:
    sources = {p.name: p.read_text() for p in EXAMPLE_SOURCES if p.suffix == ".py"}
    blocks = code_blocks("python")
    assert len(blocks) >= 15
    for name, block in blocks:
        assert any(block in text for text in sources.values()), (
            f"a python block in docs/{name} is not verbatim in any examples/*.py file:\n{block}")


def test_every_json_block_is_copied_from_an_example() -> None:
    sources = [p.read_text() for p in EXAMPLE_FILES if p.suffix == ".json"]
    blocks = code_blocks("json")
    assert blocks
    for name, block in blocks:
        assert any(block in text for text in sources), f"a json block in docs/{name} drifted"


@pytest.mark.parametrize(("language", "suffix"), [
    ("toml", ".toml"), ("yaml", ".yaml"), ("dockerfile", "Dockerfile")])
def test_every_config_block_is_copied_from_an_example(language: str, suffix: str) -> None:
    # the service's files (operations/alerts.md's Prometheus configuration is its own)
    sources = [p.read_text() for p in EXAMPLE_SOURCES if p.name.endswith(suffix)]
    pages = ("service.md", "deployment.md", "testing.md")
    blocks = [(n, b) for n, b in code_blocks(language) if n in pages]
    assert blocks
    for name, block in blocks:
        assert any(block in text for text in sources), (
            f"a {language} block in docs/{name} is not verbatim in any examples/ file:\n{block}")


def test_no_untagged_code_blocks() -> None:
    for name, block in code_blocks(""):
        raise AssertionError(f"docs/{name} has a code block without a language:\n{block}")


# -- examples run ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLE_MODULES)
def test_example_imports(name: str) -> None:
    module = example(name)
    assert module.__doc__, f"examples/{name}.py needs a docstring saying what it shows"


def test_the_handler_examples_are_found() -> None:
    assert {"billing", "registry_layout", "signals", "saga", "batching"} <= set(HANDLER_MODULES)


@pytest.mark.parametrize("name", HANDLER_MODULES)
def test_example_handlers_build_a_route_table(name: str) -> None:
    module = example(name)
    routes = RouteTable.build([module])
    assert routes.by_type or routes.by_topic


def test_route_tables_of_the_examples() -> None:
    billing, layout, signals = example("billing"), example("registry_layout"), example("signals")
    assert set(RouteTable.build([billing]).by_type) == {"order.created", "order.cancelled"}
    assert set(RouteTable.build([signals]).by_type) == {"charge.requested", "coupon.applied"}
    routes = RouteTable.build([layout.everything])
    assert set(routes.by_type) == {"order.created", "order.cancelled", "stock.reserved"}
    assert set(routes.by_topic) == {"legacy-orders"}
    assert routes.by_type["stock.reserved"].model is layout.StockReserved
    legacy = routes.find("something.else", "legacy-orders")
    assert legacy is not None
    assert legacy.func is layout.import_legacy
    assert routes.find(None, "orders") is None


def test_example_consumers_build() -> None:
    billing = example("billing").build(KAFKA, DSN, ["orders"])
    assert (billing.name, billing.topics, billing.schema) == ("billing", ["orders"], "consumerkit")

    layout = example("registry_layout").build(KAFKA, DSN)
    route = layout.routes.find("order.created", "orders")
    assert route is not None
    assert route.func is example("billing").charge

    policies = example("policies").build(KAFKA, DSN)
    assert policies.dedup.retention == timedelta(days=30)
    assert policies.retry.max_attempts == 6
    assert [type(s) for s in policies.dead_letter] == [DeadLetterTable, DeadLetterTopic]
    assert policies.maintenance_interval == timedelta(hours=1)

    settings = example("consumer_settings").build(KAFKA, DSN, "secret")
    assert settings.kafka_consumer_options["security_protocol"] == "SASL_SSL"
    assert settings.kafka_consumer_options["session_timeout_ms"] == 30_000
    assert "session_timeout_ms" not in settings.kafka_options
    assert "secret" not in repr(settings)
    assert (settings.handler_timeout, settings.batch_size) == (30.0, 500)
    # "a revocation waits at most half of rebalance_timeout_ms", or shutdown_timeout if shorter
    assert settings.revoke_timeout == min(20.0, 60_000 / 2 / 1000) == 20.0
    assert billing.revoke_timeout == min(30.0, 60_000 / 2 / 1000) == 30.0
    assert billing.handler_timeout == 60.0

    batching = example("batching")
    database_only = batching.build_database_only(KAFKA, DSN)
    assert (database_only.concurrency, database_only.max_batch,
            database_only.max_in_flight) == (4, 500, 5_000)
    slow_io = batching.build_slow_io(KAFKA, DSN)
    assert (slow_io.max_batch, slow_io.concurrency) == (1, 64)
    assert (billing.max_batch, billing.outbox, billing.dedup_cache) == (500, None, None)
    assert billing.concurrency == 4  # the default with batches

    saga = example("saga").build(KAFKA, DSN, ["orders"], schema="payments")
    assert saga.outbox is not None
    assert (saga.schema, saga.outbox.table.schema, saga.outbox.table.table) == (
        "payments", "payments", "outbox")


def test_retry_policy_waits_are_as_documented() -> None:
    import random

    rng = random.Random(7)
    retry: RetryPolicy = example("policies").retry
    bases = [0.5, 1, 2, 4, 8]
    for attempt, base in enumerate(bases, start=1):
        for _ in range(20):
            assert base / 2 <= retry.delay(attempt, rng) <= base
    assert sum(bases) == 15.5
    default = RetryPolicy()
    for attempt, base in enumerate([0.2, 0.4, 0.8, 1.6], start=1):
        assert base / 2 <= default.delay(attempt, rng) <= base + 1e-9


async def test_signals_example_dead_letters_before_touching_the_database() -> None:
    signals = example("signals")
    assert not is_retriable(signals.PaymentDeclined("no"))
    ctx = HandlerContext(cast(Any, None), envelope(), 1, logging.LoggerAdapter(
        logging.getLogger("test"), {}))
    event = signals.ChargeRequested(order_id="o", account_id="a", amount=1, currency="GBP")
    with pytest.raises(DeadLetter, match="unsupported currency"):
        await signals.charge(event, ctx)


class _Outbox:
    """Records what ``ctx.publish`` hands to the outbox."""

    def __init__(self) -> None:
        self.added: list[dict[str, Any]] = []

    async def add(self, conn: Any, **event: Any) -> UUID:
        self.added.append({"conn": conn, **event})
        return UUID(int=1)


async def test_saga_example_publishes_in_the_handlers_transaction() -> None:
    saga = example("saga")
    tx, outbox = _Tx(), _Outbox()
    ctx = HandlerContext(cast(Any, tx), envelope(), 1, handler="examples.saga.take_payment",
                         outbox=cast(Any, outbox))
    await saga.take_payment(saga.OrderCreated(order_id="o-1", amount=3), ctx)
    assert tx.statements == ["INSERT INTO payments (order_id, amount) VALUES ($1, $2)"]
    [added] = outbox.added
    # the same transaction as the payment and the dedup row (ctx.tx sends deferred writes
    # before each statement of its connection)
    assert added["conn"] is ctx.tx
    assert (added["event_type"], added["aggregate_type"], added["aggregate_id"]) == (
        "payment.completed", "payment", "o-1")
    # docs/handlers.md: the event's id is the cause, and the correlation id when it has none
    assert added["headers"] == {"causation_id": "evt-1", "correlation_id": "evt-1"}


async def test_publish_without_an_outbox_is_a_configuration_error() -> None:
    saga = example("saga")
    ctx = HandlerContext(cast(Any, _Tx()), envelope(), 1)
    with pytest.raises(ConfigurationError, match="needs an outbox"):
        await saga.take_payment(saga.OrderCreated(order_id="o-1", amount=3), ctx)


class _Tx:
    def __init__(self) -> None:
        self.statements: list[str] = []

    async def execute(self, sql: str, *args: Any) -> str:
        self.statements.append(sql)
        return "INSERT 0 1"


def test_logging_example_formats_handler_records(capsys: pytest.CaptureFixture[str]) -> None:
    running = example("running")
    handler_log = logging.getLogger("consumerkit.handler")
    before = list(handler_log.handlers)
    try:
        running.configure_logging()
        extra = {"event_id": "evt-1", "event_type": "order.created", "topic": "orders",
                 "partition": 0, "offset": 7, "handler": "examples.billing.charge"}
        logging.LoggerAdapter(handler_log, extra).warning("charged")
    finally:
        for added in set(handler_log.handlers) - set(before):
            handler_log.removeHandler(added)
        handler_log.propagate = True
    assert "examples.billing.charge evt-1 orders/0/7: charged" in capsys.readouterr().err


# -- the wire format ---------------------------------------------------------------------------

def envelope() -> Envelope:
    return Envelope("evt-1", "header", "order.created", "o-1", "orders", 0, 7,
                    datetime(2024, 5, 1, tzinfo=UTC))


def test_wire_format_examples_decode() -> None:
    wire, billing = example("wire_format"), example("billing")
    routes = RouteTable.build([billing])
    payload = billing.OrderCreated(order_id="o-1", amount=3).model_dump_json().encode()
    at = datetime(2024, 5, 1, 12, tzinfo=UTC)
    headers = wire.wire_headers("evt-1", "order.created", occurred_at=at, correlation_id="c-1")
    decoded = Decoder(routes, WireFormat(), 1 << 20).decode(
        Record("orders", 1, 5, b"o-1", payload, headers))
    env = decoded.envelope
    assert (env.event_id, env.id_source, env.key, env.occurred_at, env.correlation_id) == (
        "evt-1", "header", "o-1", at, "c-1")
    assert decoded.route.func is billing.charge

    legacy = Decoder(routes, wire.legacy_wire, 1 << 20)
    with_header = legacy.decode(Record("orders", 0, 1, None, payload, [
        ("message-id", b"m-1"), ("type", b"order.created"), ("created-at", b"2024-05-01")]))
    assert (with_header.envelope.event_id, with_header.envelope.id_source) == ("m-1", "header")
    in_payload = legacy.decode(Record("orders", 0, 2, None, b'{"uuid": "u-1", "order_id": "o",'
                                      b' "amount": 1}', [("type", b"order.created")]))
    assert (in_payload.envelope.event_id, in_payload.envelope.id_source) == ("u-1", "payload")

    position = Decoder(routes, wire.position_wire, 1 << 20).decode(
        Record("orders", 3, 42, None, payload, [("event_type", b"order.created")]))
    assert (position.envelope.event_id, position.envelope.id_source) == (
        "orders/3/42", "position")


def test_the_debezium_example_is_the_config_start_debezium_runs() -> None:
    """The example file, the wire-format page's block and ``event_router_config`` agree: the
    connector tested end to end is the one the docs show."""
    text = (EXAMPLES / "debezium_outbox.json").read_text()
    config = json.loads(text)["config"]
    table = OutboxTable(*config["table.include.list"].split("."))
    assert deployment_settings(config) == event_router_config(table)
    assert set(config) - set(event_router_config(table)) <= CONNECTION_KEYS
    assert f"```json\n{text}```" in page("wire-format.md")


def test_the_retained_outbox_example_reads_through_the_migrated_publication() -> None:
    """The connector of an outbox kept in time partitions: the plain example's settings, the
    slot and the publication ``consumerkit migrate --outbox-cdc`` creates, which the
    connector must not create itself; shown on the outbox page."""
    text = (EXAMPLES / "debezium_outbox_retention.json").read_text()
    config = json.loads(text)["config"]
    plain = json.loads((EXAMPLES / "debezium_outbox.json").read_text())["config"]
    schema, name = config["table.include.list"].split(".")
    table = OutboxTable(schema, name, OutboxRetention())
    assert deployment_settings(config) == event_router_config(table)
    assert config["publication.name"] == table.publication
    assert config["publication.autocreate.mode"] == "disabled"
    assert config["slot.name"] == table.replication_slot
    assert config == plain  # one connector reads either layout
    assert f"```json\n{text}```" in page("outbox.md")


def test_a_record_as_the_debezium_example_emits_it_decodes() -> None:
    config = json.loads((EXAMPLES / "debezium_outbox.json").read_text())["config"]
    default = WireFormat()
    assert config["transforms.outbox.table.field.event.id"] == "id" == default.id_header
    placed = {
        column: alias for column, where, alias in (
            item.split(":") for item in
            config["transforms.outbox.table.fields.additional.placement"].split(","))
        if where == "header"}
    assert placed == {"type": default.event_type_header,
                      "aggregatetype": default.aggregate_type_header,
                      "occurred_at": default.occurred_at_header,
                      "headers": HEADERS_HEADER}
    for converter in ("key.converter", "value.converter"):
        assert config[converter] == "org.apache.kafka.connect.storage.StringConverter"

    routes = RouteTable.build([example("billing")])
    record = Record("orders", 0, 9, b"order-1", b'{"order_id": "order-1", "amount": 12}', [
        ("id", b"4d47e190-0402-4048-bc2c-89dd54343cdc"), ("event_type", b"order.created"),
        ("aggregate_type", b"orders"), ("occurred_at", b"2024-05-01T12:00:00.12Z"),
        ("headers", b'{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}'),
    ])
    env = Decoder(routes, default, 1 << 20).decode(record).envelope
    assert env.traceparent == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert "headers" not in env.headers
    assert env.event_id == "4d47e190-0402-4048-bc2c-89dd54343cdc"
    assert env.occurred_at == datetime(2024, 5, 1, 12, 0, 0, 120000, tzinfo=UTC)
    assert env.aggregate_type == "orders"


# -- tables that restate the code --------------------------------------------------------------

def test_consumer_arguments_table_matches_the_signature() -> None:
    params = {name: p for name, p in inspect.signature(Consumer.__init__).parameters.items()
              if p.kind is inspect.Parameter.KEYWORD_ONLY}
    rows = table_rows(section(page("consumer.md"), "Arguments"))
    documented = {first_code(r[0]): r[1] for r in rows}
    assert set(documented) == set(params)
    for name, default in documented.items():
        expected = params[name].default
        if default == "required":
            assert expected is inspect.Parameter.empty, name
        elif name in GROUPS:  # a group: its defaults, as `Limits()` builds them
            assert first_code(default) == f"{GROUPS[name].__name__}()", name
            assert expected == GROUPS[name](), name
        else:
            assert ast.literal_eval(first_code(default)) == expected, name


def test_the_option_groups_table_lists_every_field_of_the_consumers_groups() -> None:
    rows = table_rows(section(page("consumer.md"), "Option groups"))
    documented = {name for r in rows for name in re.findall(r"`([a-z_]+\.[a-z_*]+)`", r[0])}
    fields = {f"{group}.{field}" for group in CONSUMER_GROUPS
              for field in GROUPS[group].model_fields}
    covered = {f for f in fields if f in documented
               or any(d.endswith("*") and f.startswith(d[:-1]) for d in documented)}
    assert covered == fields, fields - covered
    assert documented <= fields | {"kafka.sasl_*", "kafka.ssl_*"}


def _setting_rows() -> dict[str, tuple[Any, str]]:
    """``{name: (value, can it be changed?)}`` from the Kafka settings table; producer rows are
    keyed ``producer <name>``."""
    rows = table_rows(section(page("consumer.md"), "Kafka options"))
    settings: dict[str, tuple[Any, str]] = {}
    for name_cell, value_cell, change in rows:
        name = re.findall(r"`([^`]+)`", name_cell)[-1]
        if name_cell.startswith("producer"):
            name = f"producer {name}"
        settings[name] = (ast.literal_eval(first_code(value_cell)), change)
    return settings


def test_kafka_settings_table_matches_the_code() -> None:
    settings = _setting_rows()
    fixed = {**kafka_transport._CONSUMER_FIXED,
             **{f"producer {k}": v for k, v in kafka_transport._PRODUCER_FIXED.items()}}
    defaults = {**kafka_transport._CONSUMER_DEFAULTS,
                **{f"producer {k}": v for k, v in kafka_transport._PRODUCER_DEFAULTS.items()}}
    assert set(settings) == set(fixed) | set(defaults)
    for name, (value, change) in settings.items():
        assert value == {**defaults, **fixed}[name], name
        assert change.startswith("no" if name in fixed else "yes"), name


def _reason_codes_in_code() -> set[str]:
    """Reason codes: the first argument of ``DecodeError(...)``, the reason argument of
    ``....dead_letter(...)`` (``self.dead_letter`` in the pipeline, ``pipeline.dead_letter`` in
    the batcher; ``_dead_letter`` in older code), the third of ``self.exhausted(...)``, and
    string constants assigned to a variable ``reason``."""
    codes: set[str] = set()
    for module in ("engine/decode.py", "versions.py", "engine/pipeline.py", "engine/unapplied.py",
                   "engine/batch.py"):
        for node in ast.walk(ast.parse((PACKAGE / module).read_text())):
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                if isinstance(func, ast.Name) and func.id == "DecodeError":
                    arg = node.args[0]
                elif (isinstance(func, ast.Attribute)
                        and func.attr in ("dead_letter", "_dead_letter") and len(node.args) > 1):
                    arg = node.args[1]
                elif (isinstance(func, ast.Attribute) and func.attr == "exhausted"
                        and len(node.args) > 2):
                    arg = node.args[2]  # (record, decoded, reason, ...)
                else:
                    continue
                codes.update(_values(arg))
            elif (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
                    and node.targets[0].id == "reason"):
                codes.update(_values(node.value))
    return codes


def _values(expr: ast.expr) -> set[str]:
    """The strings an expression can evaluate to: a constant, or either branch of ``x if c
    else y``."""
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        return {expr.value}
    if isinstance(expr, ast.IfExp):
        return _values(expr.body) | _values(expr.orelse)
    return set()


def test_every_dead_letter_reason_is_documented() -> None:
    in_code = _reason_codes_in_code()
    assert {"invalid_json", "handler_failed", "expired"} <= in_code  # the parse found them
    rows = table_rows(section(page("failures.md"), "Dead-letter reasons"))
    assert {first_code(r[0]) for r in rows} == in_code


def test_every_statistic_is_documented() -> None:
    rows = table_rows(section(page("operations/index.md"), "Statistics"))
    documented = {first_code(r[0]) for r in rows}
    assert documented == {f.name for f in dataclasses.fields(ConsumerStats)}


def test_every_logger_is_documented() -> None:
    names = {name for path in PACKAGE.rglob("*.py") if "testing" not in path.parts
             for name in re.findall(r'getLogger\("([^"]+)"\)', path.read_text())}
    assert "consumerkit.handler" in names
    rows = table_rows(section(page("operations/index.md"), "Logging"))
    assert {first_code(r[0]) for r in rows} == names


def test_migration_steps_table_matches_the_code() -> None:
    rows = table_rows(section(page("operations/index.md"), "Migrations"))
    documented = {(first_code(r[0]).split(":")[0], int(r[1])) for r in rows if r[1]}
    in_code = ({("core", s.version) for s in CORE_STEPS}
               | {("dedup", s.version) for s in DEDUP_STEPS}
               | {("parking", version) for version, _, _ in PARKING_STEPS})
    assert documented == in_code


# -- the command line --------------------------------------------------------------------------

def test_cli_commands_are_documented() -> None:
    subparsers = next(a for a in _parser()._actions
                      if isinstance(a, argparse._SubParsersAction))
    commands = list(subparsers.choices)
    assert set(commands) == {"run", "relay", "config", "check", "demo", "migrate", "dedup",
                             "dead-letters", "outbox", "parked", "offsets", "topics",
                             "asyncapi", "dev", "send", "lookup"}
    usage = section(page("operations/index.md"), "Command line")
    for command in commands:
        assert f"consumerkit {command}" in usage


def test_cli_usage_lists_the_options_of_each_command() -> None:
    subparsers = next(a for a in _parser()._actions
                      if isinstance(a, argparse._SubParsersAction))
    usage = section(page("operations/index.md"), "Command line")
    reference = page("configuration.md")
    lines = usage.splitlines()
    commands = dict(subparsers.choices)
    for command, parser in subparsers.choices.items():  # a line per action: `parked list`, ...
        actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if actions and all(any(x.startswith(f"consumerkit {command} {name} ") for x in lines)
                           for name in actions[0].choices):
            del commands[command]
            commands.update({f"{command} {name}": p for name, p in actions[0].choices.items()})
    for command, parser in commands.items():
        line = next(x for x in usage.splitlines() if x.startswith(f"consumerkit {command} "))
        settings = {a for g in parser._action_groups if g.title == "settings"
                    for a in g._group_actions}
        # an option by its first long name (``--postgres-dsn``, not its short ``--postgres``);
        # both of a ``--[no-]`` pair
        options = {o for a in parser._actions if a not in settings
                   for o in [o for o in a.option_strings if o.startswith("--")][
                       :None if isinstance(a, argparse.BooleanOptionalAction) else 1]
                   } - {"--help", "--debug", "--env-file"}
        assert set(re.findall(r"--[a-z-]+", line)) == options, command
        if settings:  # "[settings]": every one of them is in the configuration reference
            assert "[settings]" in line, command
            for action in settings:
                flag = action.option_strings[0].removeprefix("--")
                assert f"`--{flag}`" in reference or f"`--[no-]{flag}`" in reference, flag


def test_the_configuration_reference_is_generated_from_the_settings() -> None:
    assert page("configuration.md") == render_reference(), (
        "docs/configuration.md is out of date: python -m consumerkit.settings.reference --write")


def test_every_option_shows_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    subparsers = next(a for a in _parser()._actions
                      if isinstance(a, argparse._SubParsersAction))
    parsers = [_parser(), *subparsers.choices.values()]
    parsers += [p for parser in subparsers.choices.values() for a in parser._actions
                if isinstance(a, argparse._SubParsersAction) for p in a.choices.values()]
    for parser in parsers:
        text = parser.format_help()
        for action in parser._actions:
            if action.option_strings and action.dest != "help":
                assert action.help, (parser.prog, action.dest)  # no help, no default shown
                helped = parser._get_formatter()._get_help_string(action)
                assert helped, (parser.prog, action.dest)
                assert "(default:" in helped, (parser.prog, action.dest)
        assert "usage: consumerkit" in text


def test_the_top_level_help_describes_the_tool(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["--help"])
    out = capsys.readouterr().out
    assert "exactly once" in out
    for command in ("run", "relay", "check", "migrate", "config"):
        assert f"    {command} " in out


@pytest.mark.parametrize("argv", [["--help"], ["dedup", "--help"], ["migrate", "--help"],
                                  ["dead-letters", "--help"], ["demo", "--help"],
                                  ["run", "--help"], ["relay", "--help"], ["check", "--help"],
                                  ["config", "relay", "--help"],
                                  ["topics", "create", "--help"]])
def test_cli_help_exits_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main(argv)
    assert info.value.code == 0
    assert "usage: consumerkit" in capsys.readouterr().out


def test_cli_dedup_help_lists_its_actions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli_main(["dedup", "--help"])
    out = capsys.readouterr().out
    assert "partitions" in out
    assert "maintain" in out
    assert "--retention" in out


def test_cli_usage_errors_exit_two(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main(["dedup", "maintain", "--retention", "7x"])
    assert info.value.code == 2
    assert "invalid duration" in capsys.readouterr().err


def test_cli_without_a_database_fails_clearly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("CONSUMERKIT_POSTGRES_DSN", raising=False)
    assert cli_main(["dead-letters"]) == 1
    assert "no database" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "expected"), [
    ("7d", timedelta(days=7)),
    ("12h", timedelta(hours=12)),
    ("30m", timedelta(minutes=30)),
    ("1d12h", timedelta(days=1, hours=12)),
    ("90m", timedelta(hours=1, minutes=30)),
])
def test_duration_parses(text: str, expected: timedelta) -> None:
    assert duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "d", "7w", "1.5h", " 7d", "7d ", "-1d", "7 d"])
def test_duration_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)
