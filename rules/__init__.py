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
    # The package's exports: each name is imported from its module on first use
    # (kernel_insight/_lazy.py reads this block); ``X as X`` marks it re-exported.
    from kernel_insight.rules.config import DEFAULT_INTERVAL_MS as DEFAULT_INTERVAL_MS
    from kernel_insight.rules.config import GroupSpec as GroupSpec
    from kernel_insight.rules.config import RuleFileError as RuleFileError
    from kernel_insight.rules.config import RuleProblem as RuleProblem
    from kernel_insight.rules.config import RuleSpec as RuleSpec
    from kernel_insight.rules.config import expand_globs as expand_globs
    from kernel_insight.rules.config import load_files as load_files
    from kernel_insight.rules.config import parse_rules as parse_rules
    from kernel_insight.rules.evaluation import Alert as Alert
    from kernel_insight.rules.evaluation import AlertingRule as AlertingRule
    from kernel_insight.rules.evaluation import AlertState as AlertState
    from kernel_insight.rules.evaluation import Group as Group
    from kernel_insight.rules.evaluation import RecordingRule as RecordingRule
    from kernel_insight.rules.evaluation import RuleEvalError as RuleEvalError
    from kernel_insight.rules.evaluation import eval_timestamp as eval_timestamp
    from kernel_insight.rules.template import TemplateError as TemplateError
    from kernel_insight.rules.template import render as render
    from kernel_insight.rules.unit import TestFileResult as TestFileResult
    from kernel_insight.rules.unit import run_test_file as run_test_file
    from kernel_insight.rules.unit import run_test_files as run_test_files


__getattr__, __dir__ = lazy_exports(globals())
