"""Hostile queries: linear-time regexes, nesting and overflow as positioned parse errors, the sample limit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import chdb
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernel_insight.kql import (
    Engine,
    EngineLimits,
    KqlError,
    KqlEvaluationError,
    KqlParseError,
    Matrix,
    MemoryStorage,
    QueryTimeoutError,
    TooManySamplesError,
    parse,
)
from kernel_insight.kql import engine as engine_module
from kernel_insight.kql.parser import MAX_DEPTH, MAX_QUERY_LENGTH
from kernel_insight.kql.printer import format_expr
from kernel_insight.kql.regex import RegexError, anchored, compile_anchored

MIN = 60_000
HOUR = 60 * MIN
TOO_MANY = "query processing would load too many samples into memory in query execution"

# ----------------------------------------------------------------------------------- regexes

REDOS = 'label_replace(label_replace(vector(1),"src","{a}!","",".*"),"dst","x","src","(a+)+b")'


def test_backtracking_patterns_run_in_linear_time() -> None:
    # With Python's re the first query took 15.7 s at 27 characters, doubling with each one more;
    # at 60 characters it would run for years. A child process bounds the test if that comes back.
    script = textwrap.dedent(
        f"""
        from kernel_insight.kql import Engine, MemoryStorage
        s = MemoryStorage()
        s.add({{"__name__": "up", "job": "{"a" * 60}!"}}, [0], [1.0])
        e = Engine(s)
        assert len(e.instant_query({REDOS.format(a="a" * 60)!r}, 0).value) == 1
        assert len(e.instant_query('up{{job=~"(a+)+b"}}', 0).value) == 0
        assert len(e.instant_query('up{{job!~"(a|aa)+$"}}', 0).value) == 1
        print("done")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"


# (pattern, text, matches): Prometheus compiles "^(?s:" + pattern + ")$" with Go's RE2 syntax.
SEMANTICS = [
    ("ab", "ab", True),
    ("ab", "ab\n", False),  # $ is the end of the text, not a line end (Python's re differs)
    ("a.b", "a\nb", True),  # . matches newlines
    ("a", "xa", False),
    ("a)|(b", "ab", True),  # the pattern is pasted, not wrapped in a group: ^(?s:a)|(b)$
    ("(?i)GPU[[:digit:]]+", "gpu12", True),
    (r"\Qa.b\E", "a.b", True),
    (r"\Qa.b\E", "axb", False),
    (r"\pL+", "ünï", True),
    ("(?P<n>x)(?<m>y)", "xy", True),
    ("gpu1|gpu2", "gpu2", True),  # literal alternations take a set lookup: same answers
    ("(gpu1|gpu2)", "gpu1gpu2", False),
    ("a|", "", True),
    ("a|b", "a|b", False),
]


@pytest.mark.parametrize(("pattern", "text", "matches"), SEMANTICS)
def test_regexes_match_as_prometheus_and_clickhouse_do(pattern: str, text: str, matches: bool) -> None:
    assert compile_anchored(pattern).matches(text) is matches
    assert (compile_anchored(pattern).match(text) is not None) is matches
    # The ClickHouse push-down hands the same anchored pattern to match() (RE2 there too).
    sql = f"SELECT match('{_sql(text)}', '{_sql(anchored(pattern))}') AS m"
    assert chdb.query(sql, "CSV").bytes().strip() == (b"1" if matches else b"0")


def _sql(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("(", "error parsing regexp: missing closing )"),
        ("[a", "error parsing regexp: missing closing ]"),
        ("a**", "error parsing regexp: invalid nested repetition operator"),
        ("(?<=a)b", "error parsing regexp: invalid or unsupported Perl syntax"),
        (r"\1", "error parsing regexp: invalid escape sequence"),
        ("a{1001}", "error parsing regexp: invalid repeat count"),
    ],
)
def test_invalid_regexes_are_refused_with_gos_words(pattern: str, message: str) -> None:
    with pytest.raises(RegexError, match=message.replace(")", r"\)").replace("]", r"\]").replace("*", r"\*")):
        compile_anchored(pattern)
    with pytest.raises(KqlParseError) as info:
        parse(f'up{{job=~"{pattern.replace(chr(92), chr(92) * 2)}"}}')
    assert message in info.value.message
    assert (info.value.line, info.value.column) == (1, 9)


def test_label_replace_refuses_an_invalid_regex() -> None:
    with pytest.raises(KqlEvaluationError, match=r"invalid regular expression in label_replace\(\)"):
        Engine(MemoryStorage()).instant_query('label_replace(vector(1), "a", "b", "c", "(")', 0)


# ----------------------------------------------------------------------------------- client input


@pytest.mark.parametrize(
    ("query", "column"),
    [
        ("+".join(["1"] * 500), None),
        ("(" * 500 + "1" + ")" * 500, None),
        ("abs(" * 300 + "vector(1)" + ")" * 300, None),
        ("sum(" * 300 + "up" + ")" * 300, None),
    ],
)
def test_deep_nesting_is_a_parse_error_with_a_position(query: str, column: int | None) -> None:
    with pytest.raises(KqlParseError, match=f"nests too deeply: more than {MAX_DEPTH} levels") as info:
        parse(query)
    assert 1 <= info.value.column <= len(query)


def test_overlong_queries_are_refused_before_parsing() -> None:
    # 50,000 matchers took 33 s to parse on the dev machine; the limit answers at once.
    query = "up{" + ",".join(f'a{i}="x"' for i in range(50_000)) + "}"
    with pytest.raises(KqlParseError, match=f"query is too long: {len(query)} characters") as info:
        parse(query)
    assert info.value.start == MAX_QUERY_LENGTH
    assert len(parse("up{" + ",".join(f'gpu!="{i}"' for i in range(500)) + "}").matchers) == 500


def test_nesting_up_to_the_limit_is_evaluated() -> None:
    terms = MAX_DEPTH - 1
    for query in ("+".join(["1"] * terms), "(" * (MAX_DEPTH - 2) + "1" + ")" * (MAX_DEPTH - 2)):
        expr = parse(query)
        assert parse(format_expr(expr)) == expr
    value = Engine(MemoryStorage()).instant_query("+".join(["1"] * terms), 0).value
    assert value.value == terms  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("query", "message", "column"),
    [
        ("up @ 1e300", "timestamp out of bounds for @ modifier", 6),
        ("up @ -1e17", "timestamp out of bounds for @ modifier", 7),
        ("up @ Inf", "timestamp out of bounds for @ modifier", 6),
        ("up offset 9999999999999999999d", "duration out of range", 11),
        ("up[9999999999999d]", "duration out of range", 4),
        ("rate(up[5m] offset (1e20))", "offset out of range", 20),
        ("up[1y:(1e20)]", "subquery step out of range", 7),
        ("up == bool fill(9999999999999999999d) up", "duration out of range", 17),
    ],
)
def test_out_of_range_times_are_parse_errors_with_a_position(query: str, message: str, column: int) -> None:
    with pytest.raises(KqlParseError, match=message) as info:
        Engine(MemoryStorage()).instant_query(query, 0)
    assert (info.value.line, info.value.column) == (1, column)


def test_the_largest_durations_still_evaluate() -> None:
    s = MemoryStorage()
    s.add({"__name__": "up"}, [0], [1.0])
    engine = Engine(s)
    assert len(engine.instant_query("up offset 106751d", 0).value) == 0  # 292 years: Go's limit
    assert len(engine.instant_query("up @ 1e15", 0).value) == 0
    assert len(engine.instant_query("count_over_time(up[106751d])", 0).value) == 1


# ----------------------------------------------------------------------------------- sample limit


def _fleet(series: int, hours: int, every_ms: int = 15_000) -> MemoryStorage:
    s = MemoryStorage()
    ts = np.arange(0, hours * HOUR + 1, every_ms, dtype=np.int64)
    for i in range(series):
        values = (np.arange(len(ts)) % 50 + i) / 100.0  # counter-like with resets every 50 samples
        s.add({"__name__": "kernel_time", "gpu": str(i)}, ts.tolist(), values.tolist())
    return s


def test_the_limit_counts_samples_held_at_once_not_every_window() -> None:
    # 20 series x 1 h windows at 15 s x 241 steps: the windows add up to ~2.3M samples, but only
    # ~20k are ever held at once (the loaded samples of each selector plus the results).
    s = _fleet(20, hours=2)
    engine = Engine(s, EngineLimits(max_samples=60_000))
    q = "count_over_time(kernel_time[1h]) > 100 and avg_over_time(kernel_time[1h]) > 0.2"
    result = engine.range_query(q, HOUR, 2 * HOUR, 15_000)
    assert isinstance(result.value, Matrix)
    assert len(result.value) == 20
    assert 0 < result.stats.peak_samples <= 60_000
    for q in ("increase(kernel_time[1h])", "resets(kernel_time[1h])"):
        assert len(engine.range_query(q, HOUR, 2 * HOUR, 15_000).value) == 20


def test_reaching_the_limit_fails_with_prometheus_text() -> None:
    s = _fleet(20, hours=2)
    with pytest.raises(TooManySamplesError) as info:
        Engine(s, EngineLimits(max_samples=5_000)).range_query(
            "avg_over_time(kernel_time[1h])", HOUR, 2 * HOUR, 15_000
        )
    assert info.value.message == TOO_MANY


# Prometheus' TestQueryStatistics / TestMaxQuerySamples data (promql/engine_test.go): every
# histogram has one span of four buckets, so Prometheus counts it as (168 + 5*8 + 8) / 16 = 13.
_STATS_DATA = """
load 10s
  metricWith1SampleEvery10Seconds 1+1x100
  metricWith1HistogramEvery10Seconds {{schema:1 count:5 sum:20 buckets:[1 2 1 1]}}+{{schema:1 count:10 sum:5 buckets:[1 2 3 4]}}x100
"""


@pytest.fixture(scope="module")
def stats_storage(tmp_path_factory: pytest.TempPathFactory) -> MemoryStorage:
    from kernel_insight.kql.promqltest import Load, _load, parse_script

    path = tmp_path_factory.mktemp("stats") / "stats.test"
    path.write_text(_STATS_DATA)
    s = MemoryStorage()
    for command in parse_script(path):
        assert isinstance(command, Load)
        _load(s, command)
    return s


@pytest.mark.parametrize(
    ("query", "start_s", "end_s", "step_s", "peak"),
    [
        # (query, start, end, step, Prometheus' PeakSamples for it in engine_test.go)
        ("metricWith1SampleEvery10Seconds", 21, None, None, 1),
        ("metricWith1SampleEvery10Seconds[60s]", 201, None, None, 6),
        ("metricWith1HistogramEvery10Seconds", 21, None, None, 13),
        ("metricWith1HistogramEvery10Seconds[60s]", 201, None, None, 78),
        ("metricWith1HistogramEvery10Seconds[60s] @ 30", 201, None, None, 52),
        ("histogram_count(max_over_time(metricWith1HistogramEvery10Seconds[20s:10s]))", 201, None, None, 52),
        ("metricWith1HistogramEvery10Seconds", 204, 223, 5, 52),
    ],
)
def test_histograms_count_by_their_size_as_in_prometheus(
    stats_storage: MemoryStorage, query: str, start_s: int, end_s: int | None, step_s: int | None, peak: int
) -> None:
    def run(limit: int) -> int:
        engine = Engine(stats_storage, EngineLimits(max_samples=limit))
        if end_s is None or step_s is None:
            return engine.instant_query(query, start_s * 1000).stats.peak_samples
        return engine.range_query(query, start_s * 1000, end_s * 1000, step_s * 1000).stats.peak_samples

    # Prometheus' own figures: the limit reached exactly is answered, one less is refused.
    assert run(peak) == peak
    with pytest.raises(TooManySamplesError, match=TOO_MANY):
        run(peak - 1)


def test_a_query_over_wide_histograms_reaches_the_limit_by_their_buckets() -> None:
    # 20 kernels' latency histograms (schema 3, ~50 buckets each) over 10 minutes at 15 s:
    # 820 histogram samples. Counted one each they would pass a 5,000 limit; by size (about
    # 40 samples each) the 5m windows need more than that.
    from kernel_insight.kql.histogram import FloatHistogram

    rng = np.random.default_rng(7)
    s = MemoryStorage()
    ts = np.arange(0, 10 * MIN + 1, 15_000, dtype=np.int64)
    weights = 0
    for k in range(20):
        pool = rng.lognormal(np.log(20e-6 * (1 + k)), 0.6, 5_000)
        hs = [FloatHistogram.from_observations(pool[: 100 * (i + 1)], 3) for i in range(len(ts))]
        weights += sum(h.sample_weight() for h in hs)
        s.add_histograms({"__name__": "kernel_duration_seconds", "kernel": f"k{k}"}, ts, hs)
    n = 20 * len(ts)
    assert weights > 20 * n  # wide: each counts as 20+ samples
    q = "histogram_quantile(0.99, sum by (kernel) (rate(kernel_duration_seconds[5m])))"
    with pytest.raises(TooManySamplesError, match=TOO_MANY):
        Engine(s, EngineLimits(max_samples=5_000)).range_query(q, 5 * MIN, 10 * MIN, 15_000)
    # The selector alone holds every loaded histogram by its size: exactly their weights.
    whole = Engine(s, EngineLimits(max_samples=weights)).instant_query(
        "kernel_duration_seconds[11m]", 10 * MIN
    )
    assert whole.stats.peak_samples == weights
    with pytest.raises(TooManySamplesError, match=TOO_MANY):
        Engine(s, EngineLimits(max_samples=weights - 1)).instant_query(
            "kernel_duration_seconds[11m]", 10 * MIN
        )
    answered = Engine(s, EngineLimits(max_samples=10 * weights)).range_query(q, 5 * MIN, 10 * MIN, 15_000)
    assert isinstance(answered.value, Matrix)
    assert len(answered.value) == 20
    assert answered.stats.peak_samples > weights // 2


@pytest.mark.parametrize("window", ["6h", "1d", "10000d"])
def test_subquery_steps_count_against_the_limit(window: str) -> None:
    # 1 ms steps: 21.6M, 86.4M, 864G steps. Refused before anything is allocated.
    engine = Engine(MemoryStorage(), EngineLimits(max_samples=1_000_000))
    with pytest.raises(TooManySamplesError, match=TOO_MANY):
        engine.instant_query(f"max_over_time(vector(1)[{window}:1ms])", 0)


def test_subquery_within_the_limit_is_answered() -> None:
    engine = Engine(MemoryStorage(), EngineLimits(max_samples=1_000_000))
    assert engine.instant_query("max_over_time(vector(1)[5m:1ms])", 0).value.samples[0].value == 1  # type: ignore[union-attr]


def test_dense_step_arrays_are_refused_before_they_are_allocated() -> None:
    s = _fleet(50, hours=1, every_ms=HOUR)  # two samples per series: sparse in time
    with pytest.raises(TooManySamplesError, match=TOO_MANY):
        Engine(s, EngineLimits(max_samples=10_000)).range_query("kernel_time", 0, HOUR, 1_000)


# ----------------------------------------------------------------------------------- fuzzing

PIECES = st.sampled_from(
    [
        "up",
        "1",
        "1e300",
        "-1e300",
        "Inf",
        "NaN",
        "9999999999999999999d",
        "106751d",
        "1ms",
        '{job=~"(a+)+b"}',
        '{job=~"("}',
        "vector(1)",
        "[1d:1ms]",
        "[5m]",
        " offset ",
        " @ ",
        "+",
        "*",
        "(",
        ")",
        "label_replace(",
        ',"a","b","c","(a|a)+"',
        "max_over_time(",
        "sum(",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PIECES, max_size=12), st.integers(0, 600), st.sampled_from(["+", "(", "abs("]))
def test_hostile_queries_fail_only_as_kql_errors(pieces: list[str], depth: int, nest: str) -> None:
    s = MemoryStorage()
    s.add({"__name__": "up", "job": "a" * 40}, [0, 60_000], [1.0, 2.0])
    engine = Engine(s, EngineLimits(max_samples=200_000, timeout_s=5))
    closing = "" if nest == "+" else ")" * depth
    for query in ("".join(pieces), nest * depth + "".join(pieces) + closing):
        try:
            engine.instant_query(query, 120_000)
            engine.range_query(query, 0, 120_000, 30_000)
        except KqlError:
            pass


# ----------------------------------------------------------------------------------- deadline


def _many(series: int) -> MemoryStorage:
    s = MemoryStorage()
    for i in range(series):
        s.add({"__name__": "x", "gpu": str(i % 7), "pod": f"p{i}", "le": "+Inf"}, [0], [float(i)])
    return s


@pytest.mark.parametrize(
    "query",
    [
        'count_values("v", x)',
        'label_replace(x, "dst", "$1", "pod", "p(.*)")',
        "quantile by (pod) (0.5, x)",
        "histogram_quantile(0.9, x)",  # one group (of one bucket) per pod, a Python loop over steps
        "increase(x[1m] anchored)",
        "x",  # building the result, series by series
    ],
)
def test_long_loops_check_the_deadline(monkeypatch: pytest.MonkeyPatch, query: str) -> None:
    # A clock that moves one second per reading. On 10 series the query reads it R times: once
    # when it starts, once to set the deadline, at its checkpoints, once at the end; a timeout
    # of R - 2 seconds is just enough. On 5,000 series only checks inside the loops (one per
    # 1,024 series at most) can read the clock more often and so pass that deadline.
    readings = [0]

    def clock() -> float:
        readings[0] += 1
        return float(readings[0])

    monkeypatch.setattr(engine_module, "time", SimpleNamespace(monotonic=clock))
    Engine(_many(10), EngineLimits(timeout_s=10**6)).range_query(query, 0, 60_000, 60_000)
    timeout = readings[0] - 2
    readings[0] = 0
    Engine(_many(10), EngineLimits(timeout_s=timeout)).range_query(query, 0, 60_000, 60_000)
    readings[0] = 0
    with pytest.raises(QueryTimeoutError, match="query timed out in expression evaluation"):
        Engine(_many(5_000), EngineLimits(timeout_s=timeout)).range_query(query, 0, 60_000, 60_000)


def test_count_values_output_is_bounded() -> None:
    with pytest.raises(TooManySamplesError, match=TOO_MANY):
        Engine(_many(5_000), EngineLimits(max_samples=20_000)).range_query(
            'count_values("v", x)', 0, 60_000, 1_000
        )
