"""Relabelling follows Prometheus: its own TestRelabel table, plus the collector's use of it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kernel_insight.collector.relabel import (
    Relabeler,
    RelabelError,
    load_relabel_configs,
    parse_relabel_configs,
    relabel,
)

_FIXTURE = Path(__file__).parent.parent / "fixtures" / "relabel" / "prometheus_relabel_cases.json"
_CASES: list[dict[str, Any]] = json.loads(_FIXTURE.read_text())["cases"]


def _labels(d: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(d.items()))


@pytest.mark.parametrize("case", _CASES, ids=[str(i) for i in range(len(_CASES))])
def test_prometheus_relabel_table(case: dict[str, Any]) -> None:
    out = relabel(parse_relabel_configs(case["relabel"]), _labels(case["input"]))
    if case["drop"]:
        assert out is None
    else:
        assert out == _labels(case["output"])


def test_the_table_was_converted_whole() -> None:
    # 34 cases with 44 rules at the pinned commit: a converter that lost cases would shrink these.
    assert len(_CASES) == 34
    assert sum(len(c["relabel"]) for c in _CASES) == 44
    assert {r.get("action", "replace") for c in _CASES for r in c["relabel"]} >= {
        "replace",
        "keep",
        "drop",
        "keepequal",
        "dropequal",
        "hashmod",
        "labelmap",
        "labeldrop",
        "labelkeep",
        "lowercase",
        "uppercase",
    }


def test_removing_the_metric_name_drops_the_series() -> None:
    r = Relabeler(parse_relabel_configs([{"action": "labeldrop", "regex": "__name__"}]))
    assert r.apply((("__name__", "up"), ("job", "a"))) is None
    assert r.dropped == 1


def test_answers_are_remembered_and_bounded() -> None:
    r = Relabeler(
        parse_relabel_configs([{"source_labels": ["job"], "target_label": "model", "replacement": "x-$1"}]),
        max_cache=2,
    )
    for i in range(5):
        assert r.apply((("__name__", "up"), ("job", str(i)))) == (
            ("__name__", "up"),
            ("job", str(i)),
            ("model", f"x-{i}"),
        )
    assert len(r._cache) <= 2


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([{"action": "explode"}], "unknown relabel action 'explode'"),
        ([{"action": "hashmod", "target_label": "h"}], "requires non-zero modulus"),
        ([{"action": "replace", "source_labels": ["a"]}], "requires 'target_label'"),
        ([{"action": "labeldrop", "regex": "a", "target_label": "b"}], "requires only 'regex'"),
        (
            [{"action": "keepequal", "source_labels": ["a"], "target_label": "b", "regex": "x"}],
            "requires only 'source_labels'",
        ),
        ([{"regex": "(", "target_label": "b"}], "missing closing )"),
        ([{"target_label": "b", "sauce_labels": ["a"]}], "unknown field(s) sauce_labels"),
        ([{"source_labels": "a", "target_label": "b"}], "source_labels must be a list"),
        ({"a": 1}, "must be a list of rules"),
        ([3], "must be a mapping"),
    ],
)
def test_bad_rules_are_refused_with_their_reason(rules: Any, message: str) -> None:
    with pytest.raises(RelabelError, match=None) as e:
        parse_relabel_configs(rules)
    assert message in str(e.value)


def test_files_in_prometheus_form(tmp_path: Path) -> None:
    f = tmp_path / "relabel.yml"
    f.write_text(
        "write_relabel_configs:\n  - source_labels: [job]\n    regex: 'vllm-(.*)'\n    target_label: model\n"
    )
    r = Relabeler(load_relabel_configs(f))
    assert dict(r.apply((("__name__", "up"), ("job", "vllm-llama"))) or ()) == {
        "__name__": "up",
        "job": "vllm-llama",
        "model": "llama",
    }
    f.write_text("- action: drop\n  source_labels: [__name__]\n  regex: 'go_.*'\n")
    assert Relabeler(load_relabel_configs(f)).apply((("__name__", "go_gc"),)) is None
    f.write_text("relabel_configs: [\n")
    with pytest.raises(RelabelError, match="not valid YAML"):
        load_relabel_configs(f)
    with pytest.raises(RelabelError, match="cannot read"):
        load_relabel_configs(tmp_path / "missing.yml")
