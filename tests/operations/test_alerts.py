"""The alert rules in docs/operations/alerts.yml: valid for promtool, unit-tested, and tied to
the runbooks and the metrics table.

The promtool tests need Debian's ``prometheus`` package (``.ci/run`` installs it); without it
they skip with the reason. The others need nothing.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from .conftest import ALERTS, OPERATIONS, UNIT_TESTS, promtool, run_tool

# PromQL words that are not metric names
_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
             "group_right", "offset", "bool", "inf", "nan"}


def rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [rule for rule in rules() if "alert" in rule]


def slug(heading: str) -> str:
    """A heading's anchor, as tests/docs/test_docs.py computes it."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers that are not functions, keywords,
    or inside label matchers, grouping clauses, strings, range and offset durations."""
    text = re.sub(r'"[^"]*"', " ", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\boffset\s+\w+", " ", text)
    names = set()
    for match in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", text):
        if match.group(2) is None and match.group(1).lower() not in _KEYWORDS:
            names.add(match.group(1))
    return names


def documented_families() -> dict[str, str]:
    """``{family: type}`` from the table of docs/operations/metrics.md."""
    text = (OPERATIONS / "metrics.md").read_text()
    section = text[text.index("\n## Families\n"):]
    section = section[:section.find("\n## ", 1)]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| `")]
    return {row[0].strip("`"): row[1] for row in rows}


def test_the_rule_file_is_valid() -> None:
    result = run_tool(promtool(), "check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_the_alert_unit_tests_pass() -> None:
    result = run_tool(promtool(), "test", "rules", str(UNIT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    cases: dict[str, dict[str, int]] = {}
    for test in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for case in test.get("alert_rule_test", []):
            counts = cases.setdefault(case["alertname"], {"firing": 0, "quiet": 0})
            counts["firing" if case.get("exp_alerts") else "quiet"] += 1
    names = {rule["alert"] for rule in alerts()}
    assert set(cases) == names
    for name, counts in cases.items():
        assert counts["firing"], f"{name} is never tested firing"
        assert counts["quiet"], f"{name} is never tested quiet"


def test_every_alert_has_a_severity_and_its_annotations() -> None:
    assert len(alerts()) >= 6
    for rule in alerts():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
        assert rule["alert"].startswith("ConsumerKit")


def test_every_runbook_url_points_at_a_runbook() -> None:
    runbooks = (OPERATIONS / "runbooks.md").read_text()
    sections = {slug(m.group(1)): m.group(2) for m in re.finditer(
        r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", runbooks, re.MULTILINE | re.DOTALL)}
    for rule in alerts():
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "runbooks.md", rule["alert"]
        assert anchor in sections, f"{rule['alert']}: no runbook section #{anchor}"
        # the section names the alert it serves
        assert f"`{rule['alert']}`" in sections[anchor], rule["alert"]


def test_every_alert_is_listed_on_the_alerts_page() -> None:
    page = (OPERATIONS / "alerts.md").read_text()
    for rule in alerts():
        assert f"| `{rule['alert']}` | {rule['labels']['severity']} |" in page, rule["alert"]


def test_every_metric_the_rules_read_is_documented() -> None:
    families = documented_families()
    assert "consumerkit_messages_total" in families
    used = {name for rule in rules() for name in metric_names(rule["expr"])}
    assert used  # the parse found them
    for name in used:
        family = re.sub(r"_(bucket|sum|count)$", "", name)
        assert name in families or families.get(family) == "histogram", (
            f"{name} is not in the table of docs/operations/metrics.md")


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (consumer, topic) (rate(consumerkit_messages_total{outcome="applied"}[5m]))',
     {"consumerkit_messages_total"}),
    ("a unless b offset 10m or absent(c)", {"a", "b", "c"}),
    ("max by (x) (max_over_time(up[1h])) > 2 * 86400", {"up"}),
])
def test_metric_names_are_found_in_expressions(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names
