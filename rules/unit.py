"""Rule unit tests in the format of ``promtool test rules`` (input_series, alert_rule_test, promql_expr_test).

A test file names rule files and test groups; each test group loads its series as the
promqltest ``load`` command does, evaluates every rule group every
``evaluation_interval`` from time 0 (or ``start_timestamp``), and compares the firing
alerts and query results at the times given with the expected ones. The procedure is
promtool's (``cmd/promtool/unittest.go``) step by step, so a file passes or fails the same
way under both; the rules and queries are kql.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kernel_insight.kql.engine import Engine
from kernel_insight.kql.errors import KqlError
from kernel_insight.kql.gocompat import go_duration
from kernel_insight.kql.lexical import format_duration, go_quote, parse_duration
from kernel_insight.kql.promqltest import ScriptError, _split_values, expand_values, parse_series
from kernel_insight.kql.storage import NO_HINTS, Matcher, MemoryStorage, SelectHints, SeriesData, StorageBase
from kernel_insight.kql.values import Scalar, Vector
from kernel_insight.rules.config import RuleFileError, expand_globs, load_files
from kernel_insight.rules.evaluation import AlertingRule, AlertState, Group, WrittenSample
from kernel_insight.rules.prefetch import CycleStorage, read_windows

__all__ = ["TestFileResult", "run_test_file", "run_test_files"]

Labels = tuple[tuple[str, str], ...]


@dataclass
class TestFileResult:
    """The outcome of one test file: ``errors`` empty means it passed."""

    __test__ = False  # not a pytest class

    path: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.errors


class _Until(StorageBase):
    """The storage as the lazy loader shows it: samples up to ``now_ms`` only."""

    def __init__(self, inner: MemoryStorage) -> None:
        self.inner = inner
        self.now_ms = 0

    def select(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[SeriesData]:
        return self.inner.select(matchers, start_ms, min(end_ms, self.now_ms), hints)

    def label_names(
        self, matchers: Sequence[Matcher], start_ms: int, end_ms: int, hints: SelectHints = NO_HINTS
    ) -> list[str]:
        return self.inner.label_names(matchers, start_ms, min(end_ms, self.now_ms), hints)

    def label_values(
        self,
        name: str,
        matchers: Sequence[Matcher],
        start_ms: int,
        end_ms: int,
        hints: SelectHints = NO_HINTS,
    ) -> list[str]:
        return self.inner.label_values(name, matchers, start_ms, min(end_ms, self.now_ms), hints)


def _duration_ms(value: Any, what: str) -> int:
    if value is None:
        return 0
    text = str(value)
    if text == "0":
        return 0
    try:
        return parse_duration(text)
    except ValueError:
        raise ValueError(f'{what}: not a valid duration string: "{text}"') from None


def _go_since_epoch(ms: int) -> str:
    """Go's ``time.Duration.String()`` of ``ts - 0`` (``1m0s``), as the rule error line prints it."""
    return go_duration(ms * 1_000_000)


def _labels_str(labels: Labels) -> str:
    return "{" + ", ".join(f"{k}={go_quote(v)}" for k, v in labels) + "}"


def _float_E(v: float) -> str:
    """``strconv.FormatFloat(v, 'E', -1, 64)``."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v == 0:
        return "0E+00"
    text = repr(float(v))
    digits = text.lstrip("-").partition("e")[0].replace(".", "")
    exp_part = text.partition("e")[2]
    mant = text.lstrip("-").partition("e")[0]
    whole = mant.partition(".")[0].lstrip("0")
    frac = mant.partition(".")[2]
    exp = int(exp_part or 0)
    if whole:
        exp += len(whole) - 1
    else:
        exp -= len(frac) - len(frac.lstrip("0")) + 1
    digits = digits.strip("0") or "0"
    m = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{'-' if v < 0 else ''}{m}E{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _pairs_str(items: list[tuple[Labels, Labels]]) -> str:
    if not items:
        return "[]"
    parts = []
    for i, (lbl, ann) in enumerate(items):
        body = f"\nLabels:{_labels_str(lbl)}\nAnnotations:{_labels_str(ann)}"
        parts.append(f"{i}:" + body.replace("\n", "\n  "))
    text = "[\n" + ",\n".join(parts) + "\n]"
    return text.replace("\n", "\n            ")


def _parse_start(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, dt.datetime):
        return round(value.timestamp() * 1000)
    text = str(value)
    try:
        return round(float(text) * 1000)
    except ValueError:
        pass
    parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return round(parsed.timestamp() * 1000)


def _check_fields(obj: Any, allowed: set[str], what: str) -> None:
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be a map")
    for key in obj:
        if key not in allowed:
            raise ValueError(f"yaml: unmarshal errors:\n  field {key} not found in type {what}")


def _load_series(store: MemoryStorage, input_series: list[Any], start_ms: int, interval_ms: int) -> None:
    for item in input_series or []:
        _check_fields(item, {"series", "values"}, "main.series")
        try:
            labels, rest = parse_series(str(item.get("series", "")))
        except ScriptError as exc:
            raise ValueError(f"parse error: {exc}") from None
        if rest.strip():
            raise ValueError(f"parse error: unexpected {rest.strip()!r} after the series")
        values = expand_values(_split_values(str(item.get("values", ""))))
        ts, vs, hts, hs = [], [], [], []
        for i, v in enumerate(values):
            if v.kind in ("float", "stale"):
                ts.append(start_ms + i * interval_ms)
                vs.append(v.value)
            elif v.hist is not None:  # {{...}} native histograms, as promtool reads them
                hts.append(start_ms + i * interval_ms)
                hs.append(v.hist)
        if ts:
            store.add(labels, ts, vs)
        if hts:
            store.add_histograms(labels, hts, hs)


def _writer(store: MemoryStorage) -> Any:
    def write(samples: list[WrittenSample]) -> None:
        for labels, ts, value in samples:
            if isinstance(value, float):
                store.add(labels, [ts], [value])
            else:
                store.add_histograms(labels, [ts], [value])

    return write


def _run_group(
    tg: dict[str, Any],
    index: int,
    rule_files: list[str],
    eval_interval_ms: int,
    order: dict[str, int],
    fuzzy: bool,
) -> list[str]:
    _check_fields(
        tg,
        {
            "interval",
            "input_series",
            "alert_rule_test",
            "promql_expr_test",
            "external_labels",
            "external_url",
            "name",
            "start_timestamp",
        },
        "main.testGroup",
    )
    name = str(tg.get("name") or "")
    interval_ms = _duration_ms(tg.get("interval"), "interval") or eval_interval_ms
    start_ms = _parse_start(tg.get("start_timestamp"))
    external_labels = {str(k): str(v) for k, v in (tg.get("external_labels") or {}).items()}
    external_url = str(tg.get("external_url") or "")
    store = MemoryStorage()
    try:
        _load_series(store, tg.get("input_series") or [], start_ms, interval_ms)
    except ValueError as exc:
        return [str(exc)]
    view = _Until(store)
    engine = Engine(view)
    try:
        specs = load_files(rule_files, default_interval_ms=interval_ms)
    except RuleFileError as exc:
        return [str(p) for p in exc.problems]
    groups = sorted((Group(s) for s in specs), key=lambda g: order.get(g.spec.name, 0))
    test_name = f"    name: {name},\n" if name else ""

    alert_tests: dict[int, list[dict[str, Any]]] = {}
    for case in tg.get("alert_rule_test") or []:
        _check_fields(case, {"eval_time", "alertname", "exp_alerts"}, "main.alertTestCase")
        t = _duration_ms(case.get("eval_time"), "eval_time")
        if not case.get("alertname"):
            where = f" (in TestGroup {name})" if name else ""
            return [
                f"an item under alert_rule_test misses required attribute alertname at eval_time {format_duration(t)}{where}"
            ]
        alert_tests.setdefault(t, []).append(case)
    expr_tests = tg.get("promql_expr_test") or []
    for case in expr_tests:
        _check_fields(case, {"expr", "eval_time", "exp_samples"}, "main.promqlTestCase")
    max_t = max([*alert_tests, *(_duration_ms(c.get("eval_time"), "eval_time") for c in expr_tests), 0])
    times = sorted(alert_tests)
    curr = 0
    errs: list[str] = []
    write = _writer(store)
    windows = {g.key: read_windows(r.spec.query for r in g.rules) for g in groups}
    ts = start_ms
    while ts <= start_ms + max_t:
        view.now_ms = ts
        eval_errs = []
        for g in groups:
            # Through the collector's per-evaluation read path (rules/prefetch.py), so the
            # differential against promtool covers it too.
            cycle = CycleStorage(view, ts - g.spec.query_offset_ms, windows[g.key])

            def write_through(samples: list[WrittenSample], cycle: CycleStorage = cycle) -> None:
                write(samples)
                cycle.absorb(samples)

            g.eval(
                Engine(cycle),
                ts,
                external_labels=external_labels,
                external_url=external_url,
                write=write_through,
            )
            for r in g.rules:
                if r.health == "err" and r.last_eval_ms == ts:
                    eval_errs.append(f"    rule: {r.name}, time: {_go_since_epoch(ts)}, err: {r.last_error}")
        errs += eval_errs
        if eval_errs:
            return errs
        while curr < len(times) and ts - start_ms <= times[curr] < ts + eval_interval_ms - start_ms:
            t = times[curr]
            wanted = {c["alertname"] for c in alert_tests[t]}
            got: dict[str, list[tuple[Labels, Labels]]] = {}
            for g in groups:
                for r in g.rules:
                    if isinstance(r, AlertingRule) and r.name in wanted:
                        got.setdefault(r.name, []).extend(
                            (a.labels, a.annotations)
                            for a in r.active.values()
                            if a.state == AlertState.FIRING
                        )
            for case in alert_tests[t]:
                got_alerts = sorted(got.get(case["alertname"], []))
                exp_alerts = []
                for exp in case.get("exp_alerts") or []:
                    _check_fields(exp, {"exp_labels", "exp_annotations"}, "main.alert")
                    lbl = {str(k): _text(v) for k, v in (exp.get("exp_labels") or {}).items()}
                    lbl["alertname"] = case["alertname"]
                    ann = {str(k): _text(v) for k, v in (exp.get("exp_annotations") or {}).items()}
                    exp_alerts.append((_canon(lbl), _canon(ann)))
                exp_alerts.sort()
                if exp_alerts != got_alerts:
                    errs.append(
                        f"{test_name}    alertname: {case['alertname']}, time: {format_duration(t)}, \n"
                        f"        exp:{_pairs_str(exp_alerts)}, \n        got:{_pairs_str(got_alerts)}"
                    )
            curr += 1
        ts += eval_interval_ms
    view.now_ms = max(view.now_ms, ts - eval_interval_ms)
    for case in expr_tests:
        errs += _expr_case(engine, case, start_ms, fuzzy)
    return errs


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "" if v is None else str(v)


def _canon(d: dict[str, str]) -> Labels:
    return tuple(sorted(d.items()))


def _same(a: float, b: float, fuzzy: bool) -> bool:
    if a == b:
        return True
    return fuzzy and (math.nextafter(a, -math.inf) == b or math.nextafter(a, math.inf) == b)


def _expr_case(engine: Engine, case: dict[str, Any], start_ms: int, fuzzy: bool) -> list[str]:
    expr = str(case.get("expr", ""))
    t = _duration_ms(case.get("eval_time"), "eval_time")
    where = f"    expr: {go_quote(expr)}, time: {format_duration(t)}"
    try:
        result = engine.instant_query(expr, start_ms + t)
    except KqlError as exc:
        return [f"{where}, err: {getattr(exc, 'brief', str(exc))}"]
    value = result.value
    # (labels, value, histogram's {{...}} test expression or ""), as promtool's parsedSample:
    # a histogram sample's value is 0 and its histogram is compared as that text.
    if isinstance(value, Scalar):
        got: list[tuple[Labels, float, str]] = [((), value.value, "")]
    elif isinstance(value, Vector):
        got = [
            (s.labels, s.value, "") if s.histogram is None else (s.labels, 0.0, s.histogram.test_expression())
            for s in value.samples
        ]
    else:
        return [f"{where}, err: rule result is not a vector or scalar"]
    exp: list[tuple[Labels, float, str]] = []
    for s in case.get("exp_samples") or []:
        _check_fields(s, {"labels", "value", "histogram"}, "main.sample")
        text = str(s.get("labels") or "")
        hist = ""
        try:
            labels, rest = parse_series(text) if text.strip() else ((), "")
            if rest.strip():
                raise ScriptError(f"unexpected {rest.strip()!r}")
            if s.get("histogram"):
                hist = _histogram_text(str(s["histogram"]))
        except ScriptError as exc:
            return [f"{where}, err: labels {go_quote(text)}: {exc}"]
        exp.append((labels, float(s.get("value", 0) or 0), hist))
    exp.sort(key=lambda x: x[0])
    got.sort(key=lambda x: x[0])
    if len(exp) != len(got) or any(
        el != gl or eh != gh or not _same(ev, gv, fuzzy)
        for (el, ev, eh), (gl, gv, gh) in zip(exp, got, strict=True)
    ):

        def fmt(items: list[tuple[Labels, float, str]]) -> str:
            if not items:
                return "nil"
            return ", ".join(f"{_labels_str(lbl)} {h or _float_E(v)}" for lbl, v, h in items)

        return [f"{where},\n        exp: {fmt(exp)}\n        got: {fmt(got)}"]
    return []


def _histogram_text(text: str) -> str:
    """An expected ``histogram:`` as promtool compares it: parsed, then written back as its test
    expression (so layouts written differently but equal compare equal)."""
    try:
        (value,) = expand_values(_split_values(text))
    except (ValueError, ScriptError) as exc:
        raise ScriptError(f"expected 1 histogram value: {exc}") from None
    if value.hist is None:
        raise ScriptError(f"expected histogram, got {text}")
    return str(value.hist.test_expression())


def run_test_file(path: str) -> TestFileResult:
    """Run every test group of one test file."""
    result = TestFileResult(path)
    try:
        doc = yaml.safe_load(Path(path).read_text())
        _check_fields(
            doc,
            {"rule_files", "evaluation_interval", "group_eval_order", "tests", "fuzzy_compare"},
            "main.unitTestFile",
        )
        base = Path(path).parent
        rule_files: list[str] = []
        for rf in doc.get("rule_files") or []:
            pattern = str(rf) if Path(str(rf)).is_absolute() else str(base / str(rf))
            matched = expand_globs([pattern])
            if not matched:
                result.warnings.append(f"no file match pattern {pattern}")
            rule_files += matched
        eval_interval = _duration_ms(doc.get("evaluation_interval"), "evaluation_interval") or 60_000
        order: dict[str, int] = {}
        for i, gn in enumerate(doc.get("group_eval_order") or []):
            if gn in order:
                raise ValueError(f"group name repeated in evaluation order: {gn}")
            order[gn] = i
        fuzzy = bool(doc.get("fuzzy_compare"))
        for i, tg in enumerate(doc.get("tests") or []):
            result.errors += _run_group(tg, i, rule_files, eval_interval, order, fuzzy)
    except (OSError, yaml.YAMLError, ValueError, AttributeError, TypeError) as exc:
        result.errors.append(str(exc))
    return result


def run_test_files(paths: Sequence[str], out: Any = None, err: Any = None) -> int:
    """``ki rules test``: promtool's output and exit status (0 all passed, 1 a test failed)."""
    out = out or sys.stdout
    err = err or sys.stderr
    failed = False
    for path in paths:
        print(f"Unit Testing:  {path}", file=out)
        result = run_test_file(path)
        for w in result.warnings:
            print(f"  WARNING: {w}", file=err)
        if result.errors:
            failed = True
            print("  FAILED:", file=err)
            for e in result.errors:
                print(e, file=err)
                print(file=out)
        else:
            print("  SUCCESS", file=out)
        print(file=out)
    return 1 if failed else 0
