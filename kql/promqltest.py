"""Run the Prometheus project's PromQL test scripts (``*.test``) against kql.

``python -m kernel_insight.kql.promqltest FILE...`` prints one line per file with the float and
native-histogram counts, every failing case, and ends with ``N passed, N failed``. A case is
*native-histogram* when the data loaded since the last ``clear`` holds ``{{...}}`` samples or
came from ``load_with_nhcb``, or when its expected result holds ``{{...}}``; every other case
is *float*. Failing cases listed in the skip file (``promqltest_skips.txt`` next to this
module: ``file:line  reason``) are known; the exit status is 1 when a failure is not listed
there or a listed case passes.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kernel_insight.kql.engine import Engine
from kernel_insight.kql.errors import KqlError
from kernel_insight.kql.histogram import (
    CUSTOM_BUCKETS_SCHEMA,
    FloatHistogram,
    HistogramNotationError,
    expand_histogram_series,
    spans_match,
)
from kernel_insight.kql.histsamples import hcompact
from kernel_insight.kql.lexical import parse_duration, unquote
from kernel_insight.kql.storage import STALE_NAN, Labels, MemoryStorage, is_stale_value, normalize_labels
from kernel_insight.kql.values import Matrix, QueryResult, Scalar, String, Vector, almost_equal

__all__ = [
    "NEWER_FILES",
    "SKIP_FILE",
    "STANDARD_FILES",
    "CaseResult",
    "FileReport",
    "load_skips",
    "main",
    "run_file",
    "same_value",
]

#: Files of standard PromQL (the 95 % target) and of newer flag-gated features.
STANDARD_FILES = (
    "aggregators.test",
    "functions.test",
    "histograms.test",
    "literals.test",
    "limit.test",
    "name_label_dropping.test",
    "operators.test",
    "range_queries.test",
    "selectors.test",
    "staleness.test",
    "trig_functions.test",
)
NEWER_FILES = (
    "duration_expression.test",
    "extended_vectors.test",
    "fill-modifier.test",
    "info.test",
    "type_and_unit.test",
    "start_timestamps.test",
)

SKIP_FILE = Path(__file__).with_name("promqltest_skips.txt")


def same_value(a: float, b: float) -> bool:
    """The harness' float comparison: relative tolerance 1e-6, NaN equals NaN, stale only equals stale."""
    if is_stale_value(a) or is_stale_value(b):
        return is_stale_value(a) and is_stale_value(b)
    if math.isnan(a) and math.isnan(b):
        return True
    return almost_equal(a, b, 1e-6)


# ----------------------------------------------------------------------------- script parsing


class ScriptError(ValueError):
    """The test script itself is malformed."""


def parse_time(text: str) -> int:
    """A time or duration as the scripts write it (``50m``, ``0``, ``10s500ms``), in ms."""
    text = text.strip()
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text) * 1000
    if text.startswith("-"):
        return -parse_duration(text[1:])
    return parse_duration(text)


_NUMBER = r"[+-]?(?:[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+\.|Inf|inf|NaN|nan)"
_EXPAND = re.compile(rf"^({_NUMBER})(?:([+-])({_NUMBER}))?x([0-9]+)$")


def _float(text: str) -> float:
    low = text.lower().lstrip("+")
    if low in ("inf", "-inf", "nan"):
        return float(low)
    return float(text)


def _split_values(text: str) -> list[str]:
    """Whitespace-separated value tokens, keeping ``{{...}}`` histogram literals whole."""
    tokens: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        j = i
        depth = 0
        while j < n and (depth > 0 or not text[j].isspace()):
            if text.startswith("{{", j):
                depth += 1
                j += 2
                continue
            if text.startswith("}}", j) and depth:
                depth -= 1
                j += 2
                continue
            j += 1
        tokens.append(text[i:j])
        i = j
    return tokens


@dataclass
class Value:
    kind: str  # "float", "skip", "stale", "histogram"
    value: float = 0.0
    hist: FloatHistogram | None = None
    hint_set: bool = False  # the script gave the histogram's counter_reset_hint (compared only then)


def histogram_values(token: str) -> list[Value]:
    """``{{...}}``, ``{{...}}x3`` and ``{{...}}+{{...}}x3`` / ``-``: the histograms a script token
    stands for (the notation is :func:`kernel_insight.kql.histogram.expand_histogram_series`)."""
    try:
        return [
            Value("histogram", hist=v.histogram, hint_set=v.hint_set) for v in expand_histogram_series(token)
        ]
    except HistogramNotationError as exc:
        raise ScriptError(f"bad histogram value {token!r}: {exc}") from None


def expand_values(tokens: Sequence[str]) -> list[Value]:
    """``0+10x3`` -> 0 10 20 30; ``_`` -> a gap; ``stale``; ``{{...}}`` -> a histogram placeholder."""
    out: list[Value] = []
    for tok in tokens:
        if tok == "_":
            out.append(Value("skip"))
            continue
        if tok == "stale":
            out.append(Value("stale", STALE_NAN))
            continue
        if "{{" in tok:
            out.extend(histogram_values(tok))
            continue
        m = re.fullmatch(r"_x([0-9]+)", tok)
        if m:
            out.extend(Value("skip") for _ in range(int(m.group(1))))
            continue
        m = _EXPAND.match(tok)
        if m:
            start = _float(m.group(1))
            delta = _float(m.group(3)) if m.group(3) else 0.0
            if m.group(2) == "-":
                delta = -delta
            out.extend(Value("float", start + k * delta) for k in range(int(m.group(4)) + 1))
            continue
        try:
            out.append(Value("float", _float(tok)))
        except ValueError:
            raise ScriptError(f"bad value {tok!r}") from None
    return out


def parse_series(text: str) -> tuple[Labels, str]:
    """``name{a="b", ...} rest`` -> (labels, rest); the name, braces and quoting are all optional."""
    text = text.strip()
    labels: dict[str, str] = {}
    m = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text)
    pos = 0
    if m:
        labels["__name__"] = m.group(0)
        pos = m.end()
    if text[pos : pos + 1] == "{":
        pos += 1
        while True:
            while pos < len(text) and text[pos] in " \t,":
                pos += 1
            if pos >= len(text):
                raise ScriptError(f"unterminated label set in {text!r}")
            if text[pos] == "}":
                pos += 1
                break
            if text[pos] in "\"'`":
                sm = re.match(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', text[pos:])
                if not sm:
                    raise ScriptError(f"bad string in {text!r}")
                name = unquote(sm.group(0))
                pos += sm.end()
            else:
                nm = re.match(r"[a-zA-Z_][a-zA-Z0-9_]*", text[pos:])
                if not nm:
                    raise ScriptError(f"bad label name in {text!r}")
                name = nm.group(0)
                pos += nm.end()
            while pos < len(text) and text[pos] == " ":
                pos += 1
            if text[pos : pos + 1] != "=":
                # A bare quoted string is the metric name.
                labels["__name__"] = name
                continue
            pos += 1
            while pos < len(text) and text[pos] == " ":
                pos += 1
            vm = re.match(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', text[pos:])
            if not vm:
                raise ScriptError(f"bad label value in {text!r}")
            labels[name] = unquote(vm.group(0))
            pos += vm.end()
    return normalize_labels(labels), text[pos:]


@dataclass
class Expect:
    kind: str  # fail, warn, info, no_warn, no_info, ordered, string, range
    msg: str | None = None
    regex: str | None = None
    string: str | None = None
    range: tuple[int, int, int] | None = None


@dataclass
class Case:
    file: str
    line: int
    query: str
    instant: bool
    at: int = 0
    start: int = 0
    end: int = 0
    step: int = 0
    expects: list[Expect] = field(default_factory=list)
    results: list[tuple[Labels | None, list[Value]]] = field(default_factory=list)
    histogram: bool = False

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def kind(self) -> str:
        return "native-histogram" if self.histogram else "float"

    def has(self, kind: str) -> bool:
        return any(e.kind == kind for e in self.expects)


@dataclass
class Load:
    interval: int
    series: list[tuple[Labels, list[Value]]]
    with_nhcb: bool = False
    #: Per entry of ``series`` that an ``@st`` line preceded: each position's start timestamp as an
    #: offset in ms from the sample's time (None: unset), as Prometheus' loader reads them.
    starts: dict[int, list[int | None]] = field(default_factory=dict)


_ST_DURATION = re.compile(r"([+-]?)([0-9]+)(ms|[smhdwy]?)")


def _st_duration(text: str, item: str) -> tuple[int, str]:
    """A signed duration at the start of ``text`` (``-30s``, ``+1m``, ``0``) in ms, and the rest."""
    m = _ST_DURATION.match(text)
    if not m or (not m.group(3) and m.group(2).strip("0")):  # a bare number other than 0 has no unit
        raise ScriptError(f"bad @st item {item!r}")
    ms = parse_duration(m.group(2) + m.group(3)) if m.group(3) else int(m.group(2)) * 1000
    return (-ms if m.group(1) == "-" else ms), text[m.end() :]


def parse_start_offsets(text: str) -> list[int | None]:
    """An ``@st`` line's sequence (Prometheus' parseSTSequence): ``_``, ``_xN``, ``<dur>``,
    ``<dur>xN`` (N+1 equal offsets) and ``<dur>+<dur>xN`` / ``<dur>-<dur>xN`` (N+1 offsets
    stepping by the second duration); each offset is ms from its sample's time, None for ``_``."""
    out: list[int | None] = []
    for item in text.split():
        if item == "_":
            out.append(None)
            continue
        m = re.fullmatch(r"_x([0-9]+)", item)
        if m:
            out.extend([None] * int(m.group(1)))
            continue
        base, rest = _st_duration(item, item)
        if not rest:
            out.append(base)
            continue
        delta = 0
        if rest[0] in "+-":
            delta, rest = _st_duration(rest, item)
        if not re.fullmatch(r"x[0-9]+", rest):
            raise ScriptError(f"bad @st item {item!r}: expected x<count> after the step")
        out.extend(base + k * delta for k in range(int(rest[1:]) + 1))
    return out


@dataclass
class Clear:
    pass


def _blocks(lines: list[str]) -> Iterator[tuple[int, list[str]]]:
    block: list[str] = []
    start = 0
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            if block:
                yield start, block
                block = []
            continue
        if block and (line == "clear" or line.split()[0].startswith(("load", "eval"))):
            yield start, block  # a command word starts a new block even without a blank line
            block = []
        if not block:
            start = number
        block.append(line)
    if block:
        yield start, block


_EXPECT = re.compile(r"^expect\s+(\w+)(?:\s+(msg|regex)\s*:\s?(.*))?$")


def parse_script(path: Path) -> list[Load | Clear | Case]:
    """The commands of one test script, in order."""
    commands: list[Load | Clear | Case] = []
    name = path.name
    histogram_data = False
    for start, block in _blocks(path.read_text().split("\n")):
        head = block[0]
        word = head.split()[0]
        if word == "clear":
            commands.append(Clear())
            histogram_data = False
            continue
        if word.startswith("load"):
            if word == "load_with_nhcb":
                histogram_data = True
            interval = parse_time(head.split()[1])
            load = Load(interval, [], word == "load_with_nhcb")
            pending: tuple[Labels, list[int | None]] | None = None
            for line in block[1:]:
                labels, rest = parse_series(line)
                if rest.startswith("@st"):
                    if pending is not None:
                        raise ScriptError(f"{name}:{start}: @st line has no following sample line")
                    pending = (labels, parse_start_offsets(rest[3:]))
                    continue
                if "{{" in rest:
                    histogram_data = True
                values = expand_values(_split_values(rest))
                if pending is not None:
                    if pending[0] != labels:
                        raise ScriptError(
                            f"{name}:{start}: @st metric does not match the following sample line"
                        )
                    if len(pending[1]) != len(values):
                        raise ScriptError(
                            f"{name}:{start}: @st line has {len(pending[1])} values but sample line has {len(values)}"
                        )
                    load.starts[len(load.series)] = pending[1]
                    pending = None
                load.series.append((labels, values))
            if pending is not None:
                raise ScriptError(f"{name}:{start}: @st line has no following sample line")
            commands.append(load)
            continue
        if word.startswith("eval"):
            commands.append(_parse_eval(name, start, block, histogram_data))
            continue
        raise ScriptError(f"{name}:{start}: unknown command {word!r}")
    return commands


def _parse_eval(name: str, line: int, block: list[str], histogram_data: bool) -> Case:
    head = block[0]
    word, rest = head.split(None, 1)
    expects: list[Expect] = []
    legacy = {"eval_fail": "fail", "eval_warn": "warn", "eval_info": "info", "eval_ordered": "ordered"}
    if word in legacy:
        expects.append(Expect(legacy[word]))
    m = re.match(r"instant\s+at\s+(\S+)\s+(.*)$", rest)
    if m:
        case = Case(name, line, m.group(2), True, at=parse_time(m.group(1)))
    else:
        m = re.match(r"range\s+from\s+(\S+)\s+to\s+(\S+)\s+step\s+(\S+)\s+(.*)$", rest)
        if not m:
            raise ScriptError(f"{name}:{line}: cannot parse {head!r}")
        case = Case(
            name,
            line,
            m.group(4),
            False,
            start=parse_time(m.group(1)),
            end=parse_time(m.group(2)),
            step=parse_time(m.group(3)),
        )
    case.expects = expects
    case.histogram = histogram_data or any("{{" in b for b in block[1:])
    for body in block[1:]:
        if body.startswith("expected_fail_message"):
            case.expects.append(Expect("fail", msg=body.split(None, 1)[1] if " " in body else ""))
            continue
        if body.startswith("expected_fail_regexp"):
            case.expects.append(Expect("fail", regex=body.split(None, 1)[1] if " " in body else ""))
            continue
        if body.startswith("expect "):
            sm = re.match(r"^expect\s+string\s+(.*)$", body)
            if sm:
                case.expects.append(Expect("string", string=unquote(sm.group(1).strip())))
                continue
            rm = re.match(r"^expect\s+range\s+vector\s+from\s+(\S+)\s+to\s+(\S+)\s+step\s+(\S+)$", body)
            if rm:
                case.expects.append(
                    Expect(
                        "range",
                        range=(parse_time(rm.group(1)), parse_time(rm.group(2)), parse_time(rm.group(3))),
                    )
                )
                continue
            em = _EXPECT.match(body)
            if not em:
                raise ScriptError(f"{name}:{line}: cannot parse {body!r}")
            kind, how, text = em.group(1), em.group(2), em.group(3)
            case.expects.append(
                Expect(kind, msg=text if how == "msg" else None, regex=text if how == "regex" else None)
            )
            continue
        if re.fullmatch(_NUMBER, body):
            case.results.append((None, [Value("float", _float(body))]))
            continue
        labels, rest = parse_series(body)
        case.results.append((labels, expand_values(_split_values(rest))))
    return case


# ----------------------------------------------------------------------------- running


@dataclass
class CaseResult:
    case: Case
    passed: bool
    reason: str = ""


@dataclass
class FileReport:
    file: str
    results: list[CaseResult]

    def count(self, kind: str, passed: bool | None = None) -> int:
        return sum(1 for r in self.results if r.case.kind == kind and (passed is None or r.passed == passed))


def _fmt_labels(labels: Labels | None) -> str:
    if labels is None:
        return "scalar"
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"


def _check_annotations(case: Case, result: QueryResult) -> str | None:
    for level, key in (("warning", "warn"), ("info", "info")):
        texts = result.warnings if level == "warning" else result.infos
        wanted = [e for e in case.expects if e.kind == key]
        if case.has("no_" + key) and texts:
            return f"unexpected {level}: {texts[0]}"
        if not wanted:
            continue
        if not texts:
            return f"expected a {level}, got none"
        for e in wanted:
            if e.msg is not None and e.msg not in texts:
                return f"expected {level} {e.msg!r}, got {texts}"
            if e.regex is not None and not any(re.search(e.regex, t) for t in texts):
                return f"expected {level} matching {e.regex!r}, got {texts}"
        specific = [e for e in wanted if e.msg is not None or e.regex is not None]
        if specific:
            for t in texts:
                if not any((e.msg == t) or (e.regex is not None and re.search(e.regex, t)) for e in specific):
                    return f"unexpected {level}: {t}"
    return None


def same_histogram(want: FloatHistogram, got: FloatHistogram, hint_set: bool) -> bool:
    """promqltest's compareNativeHistogram on both sides compacted: counts within 1e-6, layouts exact."""
    a, b = hcompact(want.copy()), hcompact(got.copy())
    if a.schema != b.schema or not same_value(a.count, b.count) or not same_value(a.sum, b.sum):
        return False
    if a.schema == CUSTOM_BUCKETS_SCHEMA and tuple(a.custom_values) != tuple(b.custom_values):
        return False
    if a.zero_threshold != b.zero_threshold or not same_value(a.zero_count, b.zero_count):
        return False
    for spans, buckets in (("negative_spans", "negative_buckets"), ("positive_spans", "positive_buckets")):
        if not spans_match(getattr(a, spans), getattr(b, spans)):
            return False
        ba, bb = list(getattr(a, buckets)), list(getattr(b, buckets))
        if len(ba) != len(bb) or not all(same_value(x, y) for x, y in zip(ba, bb, strict=True)):
            return False
    return not hint_set or a.counter_reset_hint == b.counter_reset_hint


def _same_point(want: Value, got_value: float, got_hist: FloatHistogram | None) -> bool:
    if want.kind == "histogram":
        return (
            got_hist is not None
            and want.hist is not None
            and same_histogram(want.hist, got_hist, want.hint_set)
        )
    return got_hist is None and same_value(want.value, got_value)


def _show(value: float, hist: FloatHistogram | None) -> str:
    return repr(value) if hist is None else str(hist)


def _compare_vector(case: Case, vec: Vector) -> str | None:
    expected = case.results
    if any(labels is None for labels, _ in expected):
        return f"expected a scalar, got a vector of {len(vec)}"
    got = {s.labels: (s.value, s.histogram) for s in vec.samples}
    if len(got) != len(vec.samples):
        return "result contains duplicate label sets"
    want: dict[Labels, Value] = {}
    for labels, values in expected:
        assert labels is not None
        if len(values) != 1:
            return f"instant eval expects one value per series ({_fmt_labels(labels)})"
        want[labels] = values[0]
    if set(got) != set(want):
        missing = [_fmt_labels(lb) for lb in want if lb not in got]
        extra = [_fmt_labels(lb) for lb in got if lb not in want]
        return f"series differ: missing {missing[:3]}, unexpected {extra[:3]}"
    for labels, value in want.items():
        if not _same_point(value, *got[labels]):
            shown = str(value.hist) if value.kind == "histogram" else repr(value.value)
            return f"{_fmt_labels(labels)}: expected {shown}, got {_show(*got[labels])}"
    if case.has("ordered"):
        order = [s.labels for s in vec.samples]
        if order != [lb for lb, _ in expected]:
            return "order differs"
    return None


def _compare_matrix(case: Case, mat: Matrix, times: list[int]) -> str | None:
    got: dict[Labels, dict[int, tuple[float, FloatHistogram | None]]] = {}
    for s in mat.series:
        points: dict[int, tuple[float, FloatHistogram | None]] = {
            int(t): (float(v), None) for t, v in zip(s.timestamps, s.values, strict=True)
        }
        points.update({int(t): (math.nan, h) for t, h in zip(s.hist_timestamps, s.histograms, strict=True)})
        got[s.labels] = points
    want: dict[Labels, dict[int, Value]] = {}
    for labels, values in case.results:
        if labels is None:
            return "expected a scalar, got a matrix"
        if len(values) > len(times):
            return f"{_fmt_labels(labels)}: {len(values)} values in the script for {len(times)} steps"
        # Fewer values than steps: the steps without one expect no point (as upstream).
        want[labels] = {t: v for t, v in zip(times, values, strict=False) if v.kind != "skip"}
    want = {k: v for k, v in want.items() if v}
    if set(got) != set(want):
        missing = [_fmt_labels(lb) for lb in want if lb not in got]
        extra = [_fmt_labels(lb) for lb in got if lb not in want]
        return f"series differ: missing {missing[:3]}, unexpected {extra[:3]}"
    for labels, expected_points in want.items():
        if set(expected_points) != set(got[labels]):
            return f"{_fmt_labels(labels)}: points at {sorted(got[labels])}, expected at {sorted(expected_points)}"
        for t, v in expected_points.items():
            if not _same_point(v, *got[labels][t]):
                shown = str(v.hist) if v.kind == "histogram" else repr(v.value)
                return f"{_fmt_labels(labels)} @{t}: expected {shown}, got {_show(*got[labels][t])}"
    return None


_TIME_FUNCS = re.compile(r"\b(start|end|range|step)\s*\(", re.IGNORECASE)


def _evaluate(engine: Engine, case: Case) -> str | None:
    fail = next((e for e in case.expects if e.kind == "fail"), None)
    try:
        if case.instant:
            result = engine.instant_query(case.query, case.at)
        else:
            result = engine.range_query(case.query, case.start, case.end, case.step)
    except KqlError as exc:
        if fail is None:
            return f"unexpected error: {type(exc).__name__}: {exc.message}"
        if fail.msg is not None and exc.message != fail.msg.strip():
            return f"expected error {fail.msg!r}, got {exc.message!r}"
        if fail.regex is not None and not re.search(fail.regex, exc.message):
            return f"expected error matching {fail.regex!r}, got {exc.message!r}"
        return None
    if fail is not None:
        return "expected an error, got none"
    problem = _check_annotations(case, result)
    if problem:
        return problem
    value = result.value
    string = next((e for e in case.expects if e.kind == "string"), None)
    if string is not None:
        if not isinstance(value, String) or value.value != string.string:
            return f"expected string {string.string!r}, got {value!r}"
        return None
    rng = next((e for e in case.expects if e.kind == "range"), None)
    if rng is not None and rng.range is not None:
        if not isinstance(value, Matrix):
            return f"expected a range vector, got {type(value).__name__}"
        start, end, step = rng.range
        return _compare_matrix(case, value, list(range(start, end + 1, step)))
    if isinstance(value, Scalar):
        if len(case.results) != 1 or case.results[0][0] is not None:
            return f"expected a vector, got scalar {value.value!r}"
        want = case.results[0][1][0].value
        return None if same_value(want, value.value) else f"expected {want!r}, got {value.value!r}"
    if isinstance(value, String):
        return f"unexpected string {value.value!r}"
    if case.instant:
        if isinstance(value, Matrix):
            return "got a range vector without 'expect range vector'"
        problem = _compare_vector(case, value)
        if problem is None:
            problem = _range_recheck(engine, case)
        return problem
    assert isinstance(value, Matrix)
    return _compare_matrix(case, value, list(range(case.start, case.end + 1, case.step)))


def _range_recheck(engine: Engine, case: Case) -> str | None:
    """As upstream: an instant eval must give the same answer as the middle step of a range query."""
    if case.has("ordered") or _TIME_FUNCS.search(case.query):
        return None
    try:
        result = engine.range_query(case.query, case.at - 60_000, case.at + 60_000, 60_000)
    except KqlError as exc:
        return f"range re-check failed: {exc.message}"
    assert isinstance(result.value, Matrix)
    got: dict[Labels, tuple[float, FloatHistogram | None]] = {}
    for s in result.value.series:
        for t, v in zip(s.timestamps, s.values, strict=True):
            if int(t) == case.at:
                got[s.labels] = (float(v), None)
        for t, h in zip(s.hist_timestamps, s.histograms, strict=True):
            if int(t) == case.at:
                got[s.labels] = (math.nan, h)
    want = {lb: vals[0] for lb, vals in case.results if lb is not None}
    if case.results and case.results[0][0] is None:
        want = {(): case.results[0][1][0]}
    if set(got) != set(want) or any(not _same_point(want[k], *got[k]) for k in want):
        shown = {_fmt_labels(k): _show(*v) for k, v in got.items()}
        return f"range re-check differs: got {shown}"
    return None


def _load(storage: MemoryStorage, command: Load) -> None:
    for n, (labels, values) in enumerate(command.series):
        offsets = command.starts.get(n)
        # A start timestamp is the sample's time plus its offset, 0 (unset) where none is given.
        st = [
            0 if offsets is None or offsets[k] is None else k * command.interval + (offsets[k] or 0)
            for k in range(len(values))
        ]
        floats = [k for k, v in enumerate(values) if v.kind in ("float", "stale")]
        if floats:
            storage.add(
                labels,
                [k * command.interval for k in floats],
                [values[k].value for k in floats],
                None if offsets is None else [st[k] for k in floats],
            )
        at = [k for k, v in enumerate(values) if v.hist is not None]
        if at:
            storage.add_histograms(
                labels,
                [k * command.interval for k in at],
                [h for h in (values[k].hist for k in at) if h is not None],
                None if offsets is None else [st[k] for k in at],
            )
    if command.with_nhcb:
        for labels, stamps, hists in custom_bucket_histograms(command):
            storage.add_histograms(labels, stamps, hists)


class _TempHistogram:
    """Prometheus' convertnhcb.TempHistogram: one classic histogram's buckets, count and sum at one time."""

    def __init__(self) -> None:
        self.buckets: list[tuple[float, float]] = []  # (le, cumulative count), ascending le
        self.count = 0.0
        self.sum = 0.0
        self.has_count = False
        self.err = False

    def set_bucket(self, le: float, count: float) -> None:
        if self.err:
            return
        if count < 0:
            self.err = True
            return
        les = [b[0] for b in self.buckets]
        if le in les:
            return
        at = sum(1 for x in les if x < le)
        if (at > 0 and count < self.buckets[at - 1][1]) or (at < len(les) and count > self.buckets[at][1]):
            self.err = True
            return
        self.buckets.insert(at, (le, count))

    def convert(self) -> FloatHistogram | None:
        if self.err:
            return None
        buckets = list(self.buckets)
        count = self.count
        if not self.has_count and buckets:
            count = buckets[-1][1]
        if not buckets or buckets[-1][0] != math.inf:
            buckets.append((math.inf, count))
        if count != buckets[-1][1]:
            return None
        deltas, prev = [], 0.0
        for _, cumulative in buckets:
            deltas.append(cumulative - prev)
            prev = cumulative
        h = FloatHistogram(
            schema=CUSTOM_BUCKETS_SCHEMA,
            zero_threshold=0.0,
            zero_count=0.0,
            count=count,
            sum=self.sum,
            positive_spans=((0, len(buckets)),),
            positive_buckets=tuple(deltas),
            negative_spans=(),
            negative_buckets=(),
            custom_values=tuple(le for le, _ in buckets[:-1]),
        )
        compacted: FloatHistogram = hcompact(h)
        return compacted


def custom_bucket_histograms(command: Load) -> list[tuple[Labels, list[int], list[FloatHistogram]]]:
    """``load_with_nhcb``: each classic histogram (``_bucket``/``_count``/``_sum`` series) of the load
    also as a native histogram with custom buckets, named without the suffix (promqltest's
    appendCustomHistogram)."""
    groups: dict[Labels, dict[int, _TempHistogram]] = {}
    for labels, values in command.series:
        lookup = dict(labels)
        name = lookup.get("__name__", "")
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix):
                break
        else:
            continue
        le = math.nan
        if suffix == "_bucket":
            try:
                le = float(lookup.get("le", "").replace("Inf", "inf"))
            except ValueError:
                continue
            if math.isnan(le):
                continue
        base = tuple(
            sorted((k, v) for k, v in {**lookup, "__name__": name[: -len(suffix)]}.items() if k != "le")
        )
        by_time = groups.setdefault(base, {})
        for k, v in enumerate(values):
            if v.kind not in ("float", "stale"):
                continue
            temp = by_time.setdefault(k * command.interval, _TempHistogram())
            if suffix == "_bucket":
                temp.set_bucket(le, v.value)
            elif suffix == "_count":
                if v.value < 0:
                    temp.err = True
                temp.count, temp.has_count = v.value, True
            else:
                temp.sum = v.value
    out = []
    for base, by_time in groups.items():
        stamps, hists = [], []
        for t in sorted(by_time):
            h = by_time[t].convert()
            if h is not None:
                stamps.append(t)
                hists.append(h)
        if stamps:
            out.append((base, stamps, hists))
    return out


def run_file(
    path: Path, skips: dict[str, str] | None = None, storage_type: type[MemoryStorage] = MemoryStorage
) -> FileReport:
    """Run every eval of one script; loads and clears apply in order. ``storage_type``: a
    MemoryStorage that answers differently (the tests' columnar one reads histograms as a store does)."""
    storage = storage_type()
    engine = Engine(storage)
    results: list[CaseResult] = []
    for command in parse_script(path):
        if isinstance(command, Clear):
            storage.clear()
        elif isinstance(command, Load):
            _load(storage, command)
        else:
            try:
                problem = _evaluate(engine, command)
            except Exception as exc:  # a crash is a failure of this case, not of the run
                problem = f"crash: {type(exc).__name__}: {exc}"
            results.append(CaseResult(command, problem is None, problem or ""))
    return FileReport(path.name, results)


# ----------------------------------------------------------------------------- skip file


def load_skips(path: Path = SKIP_FILE) -> dict[str, str]:
    """``file:line`` -> reason, from the skip file (``#`` comments and blank lines ignored)."""
    skips: dict[str, str] = {}
    if not path.exists():
        return skips
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, _, reason = line.partition(" ")
        skips[key] = reason.strip()
    return skips


def default_dir() -> Path:
    """``<repo root>/tests/fixtures/promqltest``: Prometheus' scripts, vendored with its LICENSE and NOTICE."""
    repo_root = Path(__file__).resolve().parent.parent
    return repo_root / "tests" / "fixtures" / "promqltest"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel_insight.kql.promqltest", description=__doc__)
    parser.add_argument(
        "files", nargs="*", type=Path, help="test scripts (default: all in tests/fixtures/promqltest)"
    )
    parser.add_argument("--skips", type=Path, default=SKIP_FILE, help="skip file (file:line reason)")
    parser.add_argument(
        "--write-skips", action="store_true", help="rewrite the skip file from this run's failures"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="do not list failing cases")
    args = parser.parse_args(argv)
    files = args.files or sorted(default_dir().glob("*.test"))
    skips = load_skips(args.skips)
    reports = [run_file(f) for f in files]
    passed = failed = unlisted = 0
    stale_skips: list[str] = []
    new_skips: dict[str, str] = {}
    for report in reports:
        fp, ft = report.count("float", True), report.count("float")
        hp, ht = report.count("native-histogram", True), report.count("native-histogram")
        print(f"{report.file}: float {fp}/{ft} passed, native-histogram {hp}/{ht} passed")
        for r in report.results:
            if r.passed:
                passed += 1
                if r.case.id in skips:
                    stale_skips.append(r.case.id)
                continue
            failed += 1
            known = r.case.id in skips
            unlisted += not known
            new_skips[r.case.id] = skips.get(r.case.id) or f"[{r.case.kind}] {r.reason}"
            if not args.quiet:
                mark = "known" if known else "FAIL"
                print(f"  {mark} {r.case.id} [{r.case.kind}] {r.case.query}\n      {r.reason}")
    for title, names in (("standard", STANDARD_FILES), ("newer", NEWER_FILES)):
        chosen = [r for r in reports if r.file in names]
        fp = sum(r.count("float", True) for r in chosen)
        ft = sum(r.count("float") for r in chosen)
        if ft:
            print(f"{title} files: float {fp}/{ft} passed ({100 * fp / ft:.1f}%)")
    hp = sum(r.count("native-histogram", True) for r in reports)
    ht = sum(r.count("native-histogram") for r in reports)
    if ht:
        print(f"all files: native-histogram {hp}/{ht} passed ({100 * hp / ht:.1f}%)")
    if args.write_skips:
        _write_skips(args.skips, new_skips)
    for case_id in stale_skips:
        print(f"  listed in the skip file but passes now: {case_id}")
    if unlisted:
        print(f"{unlisted} failing case(s) not listed in {args.skips.name}")
    print(f"{passed} passed, {failed} failed")
    return 1 if (unlisted or stale_skips) and not args.write_skips else 0


def _write_skips(path: Path, skips: dict[str, str]) -> None:
    header = (
        "# PromQL test cases kql does not pass yet, one per line: <file>:<line of the eval> <reason>.\n"
        "# The promqltest runner fails when a failing case is missing here or a listed case passes.\n"
        "# Regenerate with: python -m kernel_insight.kql.promqltest --write-skips\n"
    )
    lines = [f"{k} {v}".replace("\n", " ") for k, v in sorted(skips.items(), key=lambda kv: _sort_key(kv[0]))]
    path.write_text(header + "\n".join(lines) + ("\n" if lines else ""))


def _sort_key(case_id: str) -> tuple[str, int]:
    name, _, line = case_id.rpartition(":")
    return name, int(line)


if __name__ == "__main__":
    sys.exit(main())
