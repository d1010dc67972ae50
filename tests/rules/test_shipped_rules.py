"""The rules shipped in deploy/rules: they load, their unit tests pass, every alert is shown
firing by a test, and they read only series the collector really writes (docs/metrics.md)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from kernel_insight.cli import main
from kernel_insight.kql.ast import VectorSelector
from kernel_insight.rules import load_files, run_test_file

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = sorted(str(p) for p in (ROOT / "deploy/rules").glob("*.yml"))
TEST_FILES = sorted(str(p) for p in (ROOT / "deploy/rules/tests").glob("*_test.yml"))


def test_the_shipped_rules_pass_ki_rules_check(capsys):
    assert len(RULE_FILES) >= 5
    assert main(["rules", "check", *RULE_FILES]) == 0
    assert capsys.readouterr().out.count("SUCCESS") == len(RULE_FILES)


@pytest.mark.parametrize("path", TEST_FILES, ids=lambda p: Path(p).name)
def test_each_shipped_rule_file_has_passing_unit_tests(path):
    result = run_test_file(path)
    assert result.errors == []
    assert result.warnings == []


def test_every_rule_file_has_a_test_file_and_every_alert_is_tested_firing():
    tested = {Path(p).name.removesuffix("_test.yml") for p in TEST_FILES}
    assert tested == {Path(p).stem for p in RULE_FILES}
    firing: set[str] = set()
    for path in TEST_FILES:
        for group in yaml.safe_load(Path(path).read_text())["tests"]:
            firing |= {c["alertname"] for c in group.get("alert_rule_test", []) if c.get("exp_alerts")}
    alerts = {r.name for g in load_files(RULE_FILES) for r in g.rules if r.kind == "alert"}
    assert alerts - firing == set()


def _selected_names(node, out: set[str]) -> set[str]:
    if isinstance(node, VectorSelector):
        names = [m.value for m in node.all_matchers() if m.name == "__name__" and m.op == "="]
        assert names, f"selector without a metric name: {node}"
        out.update(names)
    elif dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            value = getattr(node, f.name)
            for child in value if isinstance(value, tuple) else (value,):
                if dataclasses.is_dataclass(child):
                    _selected_names(child, out)
    return out


def test_the_rules_read_only_series_the_collector_writes():
    documented = set(re.findall(r"^\| `([a-z_:]+)` \|", (ROOT / "docs/metrics.md").read_text(), re.M))
    documented |= set(
        re.findall(r"^\| \d+ \| `[A-Z_]+` \| `([a-z_:]+)` \|", (ROOT / "docs/metrics.md").read_text(), re.M)
    )
    documented |= set(
        re.findall(r"^\| \d+ \| \d+ \| `([A-Z0-9_]+)` \|", (ROOT / "docs/metrics.md").read_text(), re.M)
    )
    assert "DCGM_FI_DEV_GPU_TEMP" in documented  # dcgm-exporter's series (deploy/rules/dcgm.yml)
    assert "kernel_execution_time_seconds" in documented
    assert "gpu_memory_free_bytes" in documented
    groups = load_files(RULE_FILES)
    recorded = {r.name for g in groups for r in g.rules if r.kind == "record"}
    read: set[str] = set()
    for g in groups:
        for r in g.rules:
            _selected_names(r.query, read)
    assert len(read) >= 10
    assert read - documented - recorded == set()
