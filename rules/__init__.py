"""Alert and recording rules in kql, evaluated by the collector and sent to Alertmanager (docs/rules.md).

>>> from kernel_insight.rules import parse_rules
>>> (group,) = parse_rules("groups: [{name: g, rules: [{alert: Hot, expr: gpu_temp_celsius > 85}]}]", "r.yml")
>>> group.rules[0].name
'Hot'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_insight._lazy import lazy_exports

if TYPE_CHECKING:
    from kernel_insight.rules.config import (
        DEFAULT_INTERVAL_MS,
        GroupSpec,
        RuleFileError,
        RuleProblem,
        RuleSpec,
        expand_globs,
        load_files,
        parse_rules,
    )
    from kernel_insight.rules.evaluation import (
        Alert,
        AlertingRule,
        AlertState,
        Group,
        RecordingRule,
        RuleEvalError,
        eval_timestamp,
    )
    from kernel_insight.rules.template import TemplateError, render
    from kernel_insight.rules.unit import TestFileResult, run_test_file, run_test_files

_EXPORTS: dict[str, tuple[str, ...]] = {
    "kernel_insight.rules.config": (
        "DEFAULT_INTERVAL_MS",
        "GroupSpec",
        "RuleFileError",
        "RuleProblem",
        "RuleSpec",
        "expand_globs",
        "load_files",
        "parse_rules",
    ),
    "kernel_insight.rules.evaluation": (
        "Alert",
        "AlertingRule",
        "AlertState",
        "Group",
        "RecordingRule",
        "RuleEvalError",
        "eval_timestamp",
    ),
    "kernel_insight.rules.template": (
        "TemplateError",
        "render",
    ),
    "kernel_insight.rules.unit": (
        "TestFileResult",
        "run_test_file",
        "run_test_files",
    ),
}

__all__ = [
    "DEFAULT_INTERVAL_MS",
    "Alert",
    "AlertState",
    "AlertingRule",
    "Group",
    "GroupSpec",
    "RecordingRule",
    "RuleEvalError",
    "RuleFileError",
    "RuleProblem",
    "RuleSpec",
    "TemplateError",
    "TestFileResult",
    "eval_timestamp",
    "expand_globs",
    "load_files",
    "parse_rules",
    "render",
    "run_test_file",
    "run_test_files",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
