"""docs/rules.md's example rule, run as written: its summary must say what the alert means."""

from __future__ import annotations

import re
from pathlib import Path

from kernel_insight.rules import run_test_file

ROOT = Path(__file__).resolve().parents[2]


def _article_rule() -> str:
    text = (ROOT / "docs" / "rules.md").read_text()
    block = text.split("The article's rule, as a file:", 1)[1]
    found = re.search(r"```yaml\n(.*?)```", block, re.S)
    assert found is not None
    return found.group(1)


def test_the_article_rules_summary_reads_the_average_not_the_count(tmp_path: Path) -> None:
    """Issue 33: after ``count > 100 and avg > 200ms``, ``$value`` is the count (``and`` keeps
    its left side), so a 300 ms kernel read "gemm averages 4m 0s" (240 samples)."""
    (tmp_path / "article.yml").write_text(_article_rule())
    (tmp_path / "article_test.yml").write_text(
        """rule_files: [article.yml]
evaluation_interval: 1m
tests:
  - interval: 15s
    input_series:
      - series: 'kernel_execution_time_seconds{model="llama-70b", instance="n1", kernel="gemm"}'
        values: '0.3x300'
      - series: 'kernel_execution_time_seconds{model="llama-70b", instance="n1", kernel="ln"}'
        values: '0.05x300'
    alert_rule_test:
      - eval_time: 70m
        alertname: SlowModelKernels
        exp_alerts:
          - exp_labels: {severity: page, model: llama-70b, instance: n1, kernel: gemm}
            exp_annotations:
              summary: 'n1: gemm averages 300ms'
"""
    )
    result = run_test_file(str(tmp_path / "article_test.yml"))
    assert result.errors == []
    assert result.warnings == []
