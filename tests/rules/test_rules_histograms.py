"""Recording rules over native histograms record histograms (Prometheus 3): written into the
store's histograms table, read back by kql, the HTTP API and the rules after them."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import numpy as np
import pytest

from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import HistogramBuilder
from kernel_insight.kql import Engine
from kernel_insight.kql.histogram import FloatHistogram
from kernel_insight.kql.storage import Matcher
from kernel_insight.rules.manager import RuleManager
from kernel_insight.rules.notifier import Notifier
from kernel_insight.server import build_collector_app

T0 = 1_800_000_000_000  # a fixed time (2027-01-15), so nothing depends on the clock
STEP = 15_000
KERNELS = ("gemm", "softmax")
RULES = """
groups:
  - name: latency
    interval: 15s
    rules:
      - record: kernel:kernel_duration_seconds:rate1m
        expr: sum by (kernel) (rate(kernel_duration_seconds[1m]))
      - record: kernel:kernel_duration_seconds:p99
        expr: histogram_quantile(0.99, kernel:kernel_duration_seconds:rate1m)
      - record: kernel:kernel_duration_seconds:negated
        expr: -kernel:kernel_duration_seconds:rate1m
"""


@pytest.fixture
def store(tmp_path):
    s = EmbeddedStore(tmp_path / "store")
    yield s
    s.close()


def _feed(store: EmbeddedStore, steps: int) -> None:
    """kernel_duration_seconds as the agent ships it: cumulative schema-3 histograms per (kernel, gpu)."""
    rng = np.random.default_rng(3)
    b = HistogramBuilder()
    for k, kernel in enumerate(KERNELS):
        for gpu in ("0", "1"):
            seen = np.empty(0)
            for i in range(steps):
                seen = np.concatenate([seen, rng.lognormal(np.log(20e-6 * (k + 1)), 0.5, 200)])
                h = FloatHistogram.from_observations(seen, 3)
                labels = {"__name__": "kernel_duration_seconds", "kernel": kernel, "gpu": gpu}
                b.add_histogram(labels, T0 + i * STEP, h)
    store.insert_histograms(b.build())


def _get(app, path: str, **params: str) -> dict:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ki") as c:
            return await c.get(path, params=params)

    r = asyncio.run(go())
    assert r.status_code == 200, r.text
    body: dict = r.json()
    return body


def test_a_recording_rule_over_kernel_histograms_records_histograms(store, tmp_path):
    _feed(store, steps=12)
    (tmp_path / "r.yml").write_text(RULES)
    m = RuleManager(store, [str(tmp_path / "r.yml")], notifier=Notifier([]))
    m.load()
    (key,) = list(m.runners)
    evals = [T0 + 5 * STEP, T0 + 6 * STEP, T0 + 7 * STEP]
    for ts in evals:
        m.tick(key, ts)
    rate_rule, p99_rule, neg_rule = m.groups[0].rules
    assert (rate_rule.health, p99_rule.health) == ("ok", "ok"), (rate_rule.last_error, p99_rule.last_error)

    # The recorded series are histograms in the histograms table, equal to the rule's query.
    storage = store.storage(use_cache=False)
    rec = storage.select(
        [Matcher("__name__", "=", "kernel:kernel_duration_seconds:rate1m")], T0, T0 + 12 * STEP
    )
    assert [dict(s.labels)["kernel"] for s in rec] == list(KERNELS)
    engine = Engine(storage)
    for s in rec:
        assert list(s.hist_timestamps) == evals
        assert len(s.timestamps) == 0  # nothing went to the float table
        kernel = dict(s.labels)["kernel"]
        for t, h in zip(s.hist_timestamps.tolist(), s.histograms, strict=True):
            (want,) = engine.instant_query(
                f'sum by (kernel) (rate(kernel_duration_seconds{{kernel="{kernel}"}}[1m]))', t
            ).value.samples  # type: ignore[union-attr]
            assert want.histogram is not None
            assert h.count == pytest.approx(want.histogram.count, rel=1e-12)
            assert h.positive_buckets == pytest.approx(want.histogram.positive_buckets, rel=1e-12)
            assert h.schema == 3
            assert h.count > 0

    # The rule after it read the recorded histogram in the same evaluation (from the group's
    # memory or the store): its p99 is the quantile of the raw data's rate.
    at = evals[-1]
    p99 = {
        dict(x.labels)["kernel"]: x.value
        for x in engine.instant_query("kernel:kernel_duration_seconds:p99", at).value.samples  # type: ignore[union-attr]
    }
    direct = {
        dict(x.labels)["kernel"]: x.value
        for x in engine.instant_query(
            "histogram_quantile(0.99, sum by (kernel) (rate(kernel_duration_seconds[1m])))", at
        ).value.samples  # type: ignore[union-attr]
    }
    assert p99 == pytest.approx(direct, rel=1e-12)
    assert 20e-6 < p99["gemm"] < p99["softmax"] < 1e-3

    # The Prometheus HTTP API returns the recorded series as histograms, as Prometheus does.
    app = build_collector_app(store, local_dev=True, keys_path=tmp_path / "k.json", rules=m)
    body = _get(app, "/api/v1/query", query="kernel:kernel_duration_seconds:rate1m", time=str(at / 1000))
    result = body["data"]["result"]
    assert len(result) == 2
    assert all("histogram" in r and "value" not in r for r in result)

    # A histogram Prometheus' TSDB would refuse (negative buckets) is discarded and the rule's
    # health says why, as Prometheus' group evaluation does.
    assert neg_rule.health == "err"
    assert "discarded" in neg_rule.last_error
    assert "negative" in neg_rule.last_error
    (group,) = _get(app, "/api/v1/rules")["data"]["groups"]
    assert [r["health"] for r in group["rules"]] == ["ok", "ok", "err"]
    assert storage.select([Matcher("__name__", "=", "kernel:kernel_duration_seconds:negated")], T0, at) == []


def test_a_recorded_histogram_series_goes_stale_when_its_source_does(store, tmp_path):
    _feed(store, steps=8)
    (tmp_path / "r.yml").write_text(RULES)
    m = RuleManager(store, [str(tmp_path / "r.yml")], notifier=Notifier([]))
    m.load()
    (key,) = list(m.runners)
    m.tick(key, T0 + 7 * STEP)
    # Past the range of rate (1m) after the last source sample: the rule returns nothing, so its
    # series get a staleness marker and an instant query right after finds no sample.
    gone = T0 + 7 * STEP + 90_000
    m.tick(key, gone)
    engine = Engine(store.storage(use_cache=False))
    before = engine.instant_query("kernel:kernel_duration_seconds:rate1m", T0 + 7 * STEP + 30_000)
    assert len(before.value) == 2  # type: ignore[arg-type]
    after = engine.instant_query("kernel:kernel_duration_seconds:rate1m", gone + 1_000)
    assert len(after.value) == 0  # type: ignore[arg-type]


UNIT_RULES = """
groups:
  - name: h
    rules:
      - record: job:lat:increase2m
        expr: sum by (job) (increase(lat[2m]))
      - record: job:lat:p90
        expr: histogram_quantile(0.9, job:lat:increase2m)
"""
UNIT_TEST = """
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'lat{{job="a",i="0"}}'
        values: '{{{{schema:0 count:4 sum:5 buckets:[1 2 1]}}}}+{{{{schema:0 count:4 sum:5 buckets:[1 2 1]}}}}x5'
      - series: 'lat{{job="a",i="1"}}'
        values: '{{{{schema:0 count:2 sum:3 buckets:[1 1]}}}}+{{{{schema:0 count:2 sum:3 buckets:[1 1]}}}}x5'
    promql_expr_test:
      - expr: job:lat:increase2m
        eval_time: 3m
        exp_samples:
          - labels: 'job:lat:increase2m{{job="a"}}'
            histogram: '{histogram}'
      - expr: job:lat:p90
        eval_time: 3m
        exp_samples:
          - labels: 'job:lat:p90{{job="a"}}'
            value: {p90!r}
"""


def _unit(tmp_path, histogram: str) -> subprocess.CompletedProcess[str]:
    from kernel_insight.kql.histogram import histogram_quantile, parse_histogram

    (tmp_path / "rules.yml").write_text(UNIT_RULES)
    # One minute's increment per series, doubled by increase's extrapolation over [2m]:
    # buckets (0.5,1] (1,2] (2,4] hold 4 6 2; the 0.9 quantile lies 0.4 into (2,4] (rank 10.8 of 12).
    p90, _ = histogram_quantile(0.9, parse_histogram("{{schema:0 count:12 sum:16 buckets:[4 6 2]}}"))
    assert 2.63 < p90 < 2.64
    (tmp_path / "test.yml").write_text(UNIT_TEST.format(histogram=histogram, p90=p90))
    return subprocess.run(
        [sys.executable, "-m", "kernel_insight.cli", "rules", "test", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_rule_unit_tests_take_histogram_series_and_expect_histograms(tmp_path):
    """``ki rules test`` reads ``{{...}}`` input series and compares ``histogram:`` expectations as
    promtool 3 does (its TestExpression text); Debian's promtool 2.42 reads neither."""
    ok = _unit(tmp_path, "{{schema:0 count:12 sum:16 buckets:[4 6 2] counter_reset_hint:gauge}}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _unit(tmp_path, "{{schema:0 count:12 sum:16 buckets:[4 6 3] counter_reset_hint:gauge}}")
    assert bad.returncode == 1
    # promtool's parsedSample text: the labels, then the histogram's TestExpression.
    exp_line = next(line for line in bad.stderr.splitlines() if line.strip().startswith("exp:"))
    got_line = next(line for line in bad.stderr.splitlines() if line.strip().startswith("got:"))
    assert exp_line.strip() == (
        'exp: {__name__="job:lat:increase2m", job="a"} '
        "{{count:12 sum:16 counter_reset_hint:gauge buckets:[4 6 3]}}"
    )
    assert got_line.strip() == (
        'got: {__name__="job:lat:increase2m", job="a"} '
        "{{count:12 sum:16 counter_reset_hint:gauge buckets:[4 6 2]}}"
    )
