"""deploy/grafana: the dashboards are well-formed, read the provisioned data source, and every
panel's query parses and type-checks in kql and names only metrics the collector produces."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from deployutil import DEPLOY, ROOT

from kernel_insight.agent import METRIC_SPECS
from kernel_insight.kql import KqlParseError, parse
from kernel_insight.kql.ast import VectorSelector, walk

DASHBOARDS = sorted((DEPLOY / "grafana" / "dashboards").glob("*.json"))
#: What Grafana puts in place of its variables before the query reaches the collector.
VARIABLES = {
    "$model": ".*",
    "$gpu_product": ".*",
    "$instance": ".*",
    "$gpu": ".*",
    "$__rate_interval": "1m",
    "$__interval": "15s",
}


def _documented_metrics() -> set[str]:
    """Metric names in docs/metrics.md's tables (derived metrics, self-metrics) and the GPU_SAMPLE ids."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    return set(re.findall(r"^\| `([a-z_:]+)`", text, re.MULTILINE)) | {s.name for s in METRIC_SPECS.values()}


def _queries(dashboard: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def test_there_are_the_four_dashboards():
    assert [p.stem for p in DASHBOARDS] == ["dcgm-exporter", "fleet-health", "ingest", "kernel-latency"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_dashboard_is_well_formed_and_reads_the_provisioned_source(path: Path):
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"].startswith("ki-")
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "kernel-insight"
        assert {"x", "y", "w", "h"} <= panel["gridPos"].keys()
        assert panel["targets"], panel["title"]
    for var in dashboard["templating"]["list"]:
        assert var["datasource"]["uid"] == "kernel-insight"


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.stem)
def test_every_panel_query_parses_in_kql_and_names_real_metrics(path: Path):
    known = _documented_metrics()
    queries = _queries(json.loads(path.read_text()))
    assert queries
    for title, expr in queries:
        for var, value in VARIABLES.items():
            expr = expr.replace(var, value)
        tree = parse(expr)
        names = {n.name for n in walk(tree) if isinstance(n, VectorSelector)}
        assert names, title
        assert names <= known, (title, names - known)


def test_a_broken_panel_query_would_be_caught():
    with pytest.raises(KqlParseError):
        parse("sum by (kernel (rate(kernel_launches_total[5m]))")
