"""Rule files: Prometheus' YAML format (groups of ``alert``/``record`` rules) with ``expr`` in kql.

Loading validates everything Prometheus' ``rulefmt`` does (and ``promtool check rules``
reports): required and unknown fields, names, durations, expressions (parsed by kql, so
``10MiB`` and ``2ms`` are fine), templates. Every problem is collected with its file and
line, so one run lists them all.

>>> groups = parse_rules('''
... groups:
...   - name: gpu
...     rules:
...       - alert: SlowKernel
...         expr: avg_over_time(kernel_execution_time_seconds[10m]) > 200ms
...         for: 5m
... ''', "example.yml")
>>> groups[0].rules[0].for_ms
300000
"""

from __future__ import annotations

import glob
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from kernel_insight.kql.ast import Expr
from kernel_insight.kql.errors import KqlParseError
from kernel_insight.kql.lexical import is_valid_label_name, is_valid_metric_name, parse_duration
from kernel_insight.kql.parser import parse
from kernel_insight.rules.template import TemplateError
from kernel_insight.rules.template import check as check_template

__all__ = [
    "DEFAULT_INTERVAL_MS",
    "GroupSpec",
    "RuleFileError",
    "RuleProblem",
    "RuleSpec",
    "expand_globs",
    "load_files",
    "parse_rules",
]

#: A group without ``interval`` is evaluated this often (Prometheus' global default, 1m).
DEFAULT_INTERVAL_MS = 60_000

_GROUP_FIELDS = frozenset({"name", "interval", "query_offset", "limit", "labels", "rules"})
_RULE_FIELDS = frozenset({"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"})


@dataclass(frozen=True, slots=True)
class RuleProblem:
    """One thing wrong with a rule file, where it is."""

    file: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.line}:{self.column}: " if self.line else f"{self.file}: "
        return where + self.message


class RuleFileError(ValueError):
    """A rule file does not load; ``problems`` lists every reason with its line."""

    def __init__(self, problems: Sequence[RuleProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """One rule as written: an alert (``kind == "alert"``) or a recording rule."""

    kind: Literal["alert", "record"]
    name: str
    expr: str
    query: Expr = field(compare=False, repr=False)
    for_ms: int = 0
    keep_firing_for_ms: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()
    line: int = 0


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A group: its rules run in order, every ``interval_ms``, at ``t - query_offset_ms``."""

    name: str
    file: str
    interval_ms: int
    rules: tuple[RuleSpec, ...]
    query_offset_ms: int = 0
    limit: int = 0
    labels: tuple[tuple[str, str], ...] = ()
    interval_set: bool = False

    @property
    def key(self) -> str:
        """The group's identity across reloads and collectors (Prometheus' ``file;name``)."""
        return f"{self.file};{self.name}"


class _Map(dict[str, Any]):
    line = 0
    column = 0


class _Loader(yaml.SafeLoader):
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    out = _Map()
    out.line, out.column = node.start_mark.line + 1, node.start_mark.column + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            raise yaml.constructor.ConstructorError(
                None, None, f"mapping key {key!r} already defined", key_node.start_mark
            )
        out[key] = loader.construct_object(value_node, deep=True)
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)


class _Collector:
    def __init__(self, file: str) -> None:
        self.file = file
        self.problems: list[RuleProblem] = []

    def add(self, node: Any, message: str) -> None:
        line = getattr(node, "line", 0)
        column = getattr(node, "column", 0)
        self.problems.append(RuleProblem(self.file, line, column, message))


def _duration(value: Any, what: str, problems: _Collector, node: Any) -> int | None:
    if value is None:
        return 0
    text = str(value) if not isinstance(value, bool) else ""
    if text == "0":
        return 0
    try:
        return parse_duration(text)
    except ValueError:
        problems.add(node, f'{what}: not a valid duration string: "{text}"')
        return None


def _string_map(
    value: Any, what: str, problems: _Collector, node: Any, *, names: str
) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        problems.add(node, f"{what} must be a map of strings")
        return ()
    out = []
    for k, v in value.items():
        if not isinstance(k, str) or not is_valid_label_name(k):
            problems.add(node, f"invalid {names} name: {k}")
            continue
        if isinstance(v, (Mapping, list)):
            problems.add(node, f"{what}: value of {k!r} must be a string")
            continue
        out.append((k, "" if v is None else _scalar_text(v)))
    return tuple(sorted(out))


def _scalar_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _rule(raw: Any, index: int, group: str, problems: _Collector) -> RuleSpec | None:
    if not isinstance(raw, _Map):
        problems.add(raw, f'group "{group}", rule {index}: a rule must be a map')
        return None
    record, alert = raw.get("record"), raw.get("alert")
    name = str(record if record is not None else alert if alert is not None else "")
    where = f'group "{group}", rule {index}, "{name}"'
    before = len(problems.problems)
    for key in raw:
        if key not in _RULE_FIELDS:
            problems.add(raw, f"{where}: field {key} not found in type rulefmt.Rule")
    if record is not None and alert is not None:
        problems.add(raw, f"{where}: only one of 'record' and 'alert' must be set")
    elif record is None and alert is None:
        problems.add(raw, f"{where}: one of 'record' or 'alert' must be set")
    expr = raw.get("expr")
    query: Expr | None = None
    if expr is None or (isinstance(expr, str) and not expr.strip()):
        problems.add(raw, f"{where}: field 'expr' must be set in rule")
    elif isinstance(expr, (Mapping, list, bool)):
        problems.add(raw, f"{where}: field 'expr' must be a string")
    else:
        try:
            query = parse(str(expr))
        except KqlParseError as exc:
            problems.add(raw, f"{where}: could not parse expression: {exc.brief}")
    if record is not None:
        if not is_valid_metric_name(str(record)):
            problems.add(raw, f"{where}: invalid recording rule name: {record}")
        for key in ("annotations", "for", "keep_firing_for"):
            if raw.get(key) is not None:
                problems.add(raw, f"{where}: invalid field '{key}' in recording rule")
    labels = _string_map(raw.get("labels"), f"{where}: labels", problems, raw, names="label")
    annotations = _string_map(
        raw.get("annotations"), f"{where}: annotations", problems, raw, names="annotation"
    )
    if any(k == "__name__" for k, _ in labels):
        problems.add(raw, f"{where}: invalid label name: __name__")
    for_ms = _duration(raw.get("for"), f"{where}: for", problems, raw)
    keep_ms = _duration(raw.get("keep_firing_for"), f"{where}: keep_firing_for", problems, raw)
    if alert is not None:
        for what, items in (("label", labels), ("annotation", annotations)):
            for k, v in items:
                try:
                    check_template(v, f"__alert_{alert}")
                except TemplateError as exc:
                    problems.add(raw, f'{where}: {what} "{k}": {exc}')
    if len(problems.problems) > before or query is None or for_ms is None or keep_ms is None:
        return None
    return RuleSpec(
        kind="record" if record is not None else "alert",
        name=name,
        expr=str(expr),
        query=query,
        for_ms=for_ms,
        keep_firing_for_ms=keep_ms,
        labels=labels,
        annotations=annotations,
        line=raw.line,
    )


def parse_rules(text: str, file: str, *, default_interval_ms: int = DEFAULT_INTERVAL_MS) -> list[GroupSpec]:
    """The groups of one rule file's text; raises :class:`RuleFileError` listing every problem."""
    problems = _Collector(file)
    try:
        doc = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (0, 0)
        raise RuleFileError([RuleProblem(file, line, col, f"yaml: {getattr(exc, 'problem', exc)}")]) from None
    if doc is None:
        return []
    if not isinstance(doc, _Map):
        raise RuleFileError([RuleProblem(file, 0, 0, "a rule file is a map with a 'groups' list")])
    for key in doc:
        if key != "groups":
            problems.add(doc, f"field {key} not found in type rulefmt.RuleGroups")
    raw_groups = doc.get("groups") or []
    if not isinstance(raw_groups, list):
        problems.add(doc, "'groups' must be a list")
        raw_groups = []
    groups: list[GroupSpec] = []
    seen: set[str] = set()
    for raw in raw_groups:
        if not isinstance(raw, _Map):
            problems.add(doc, "a group must be a map")
            continue
        before = len(problems.problems)
        name = raw.get("name")
        for key in raw:
            if key not in _GROUP_FIELDS:
                problems.add(raw, f"field {key} not found in type rulefmt.RuleGroup")
        if name is None or str(name) == "":
            problems.add(raw, "Groupname must not be empty")
            name = ""
        name = str(name)
        if name and name in seen:
            problems.add(raw, f'groupname: "{name}" is repeated in the same file')
        seen.add(name)
        interval = _duration(raw.get("interval"), f'group "{name}": interval', problems, raw)
        if interval is not None and raw.get("interval") is not None and interval <= 0:
            problems.add(raw, f'group "{name}": interval must be positive')
        offset = _duration(raw.get("query_offset"), f'group "{name}": query_offset', problems, raw)
        limit = raw.get("limit", 0) or 0
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            problems.add(raw, f'group "{name}": limit must be a non-negative integer')
            limit = 0
        glabels = _string_map(raw.get("labels"), f'group "{name}": labels', problems, raw, names="label")
        raw_rules = raw.get("rules") or []
        if not isinstance(raw_rules, list):
            problems.add(raw, f'group "{name}": rules must be a list')
            raw_rules = []
        rules = [_rule(r, i + 1, name, problems) for i, r in enumerate(raw_rules)]
        if len(problems.problems) > before:
            continue
        groups.append(
            GroupSpec(
                name=name,
                file=file,
                interval_ms=interval or default_interval_ms,
                rules=tuple(r for r in rules if r is not None),
                query_offset_ms=offset or 0,
                limit=limit,
                labels=glabels,
                interval_set=raw.get("interval") is not None,
            )
        )
    if problems.problems:
        raise RuleFileError(problems.problems)
    return groups


def expand_globs(patterns: Sequence[str]) -> list[str]:
    """Files matching any pattern, sorted, each once (a pattern that matches nothing adds nothing)."""
    out: set[str] = set()
    for pattern in patterns:
        out.update(p for p in glob.glob(pattern) if Path(p).is_file())
    return sorted(out)


def load_files(paths: Sequence[str], *, default_interval_ms: int = DEFAULT_INTERVAL_MS) -> list[GroupSpec]:
    """Every group of every file; raises :class:`RuleFileError` with the problems of all files."""
    groups: list[GroupSpec] = []
    problems: list[RuleProblem] = []
    for path in paths:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(RuleProblem(path, 0, 0, f"cannot read: {exc}"))
            continue
        try:
            groups += parse_rules(text, path, default_interval_ms=default_interval_ms)
        except RuleFileError as exc:
            problems += exc.problems
    if problems:
        raise RuleFileError(problems)
    return groups
