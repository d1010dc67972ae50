"""The collector's bound on histogram bases (hist_base.BaseBudget, issue 14): the byte estimate
against what the bases really take, least-recently-used eviction across agents, the bound under
many agents, and an evicted base handled like one never held (left out, snapshot asked for)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_hist_increments import T0, Buckets, S, decode, derive, row

from kernel_insight.cli import build_parser
from kernel_insight.collector import hist_base
from kernel_insight.collector.derive import Deriver
from kernel_insight.collector.hist_base import (
    BUCKET_BYTES,
    CUM_BYTES,
    SERIES_BYTES,
    BaseBudget,
    HistogramBases,
)
from kernel_insight.collector.metrics import CollectorMetrics
from kernel_insight.collector.wire_hist import HistKind, HistRow


@pytest.fixture(autouse=True)
def _every_export_a_base(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hist_base, "BASE_MIN_COUNT", 1)


def _snapshots(ids: range, buckets: int, count: int) -> list[HistRow]:
    b: Buckets = {i: count // buckets for i in range(buckets)}
    return [row(b, 0, count, 1.0, ident=i) for i in ids]


def _recount(budget: BaseBudget, owners: list[HistogramBases]) -> int:
    """The estimate computed afresh from what the owners hold (the budget keeps it incrementally)."""
    total = 0
    for bases in owners:
        for run in bases._runs.values():
            for s in run.series.values():
                total += SERIES_BYTES
                for cum in s.history.values():
                    total += CUM_BYTES + BUCKET_BYTES * (len(cum.pos[0]) + len(cum.neg[0]))
    assert total == budget.bytes
    return total


@pytest.mark.parametrize("buckets", [10, 60])
def test_the_byte_estimate_is_what_the_bases_take(buckets: int) -> None:
    """tracemalloc's count of what 300 series of four bases each hold, against the budget's figure."""
    budget = BaseBudget(1 << 40)
    bases = HistogramBases(budget=budget)
    sections = [decode(_snapshots(range(300), buckets, 5000 + 100 * k), T0 + k * S) for k in range(4)]
    tracemalloc.start()
    try:
        for section in sections:
            bases.resolve(section, 5)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert budget.series == 300
    assert 0.8 * held <= budget.bytes <= 1.25 * held, (held, budget.bytes)
    _recount(budget, [bases])


def test_least_recently_used_series_lose_their_bases_first() -> None:
    """Room for three series (and one more base): a fourth evicts the one used longest ago,
    whichever agent holds it; a series whose base was just used (an increment rebuilt over it) stays."""
    one = SERIES_BYTES + CUM_BYTES + BUCKET_BYTES
    budget = BaseBudget(3 * one + CUM_BYTES + BUCKET_BYTES)
    a, b = Deriver("a", base_budget=budget), Deriver("b", base_budget=budget)
    derive(a, [row({0: 1}, 0, 1, 0.1, first=True, ident=7)], T0)
    derive(b, [row({0: 1}, 0, 1, 0.1, first=True, ident=7)], T0)
    derive(a, [row({0: 1}, 0, 1, 0.1, first=True, ident=8)], T0)
    assert (budget.series, budget.evictions) == (3, 0)
    rows, _ = derive(a, [row({0: 2}, 0, 2, 0.2, base=({0: 1}, 0, 1), ident=7)], T0 + S)  # a's 7 used again
    assert [r["count"] for r in rows] == [2]
    derive(b, [row({0: 1}, 0, 1, 0.1, first=True, ident=8)], T0 + S)  # a fourth: b's 7 is the oldest
    assert (budget.series, budget.evictions) == (3, 1)
    assert budget.bytes <= budget.max_bytes
    rows, values = derive(b, [row({0: 3}, 0, 3, 0.3, base=({0: 1}, 0, 1), ident=7)], T0 + 2 * S)
    assert rows == []
    assert values["histogram_without_base"] == 1
    assert b.snapshot_wanted
    assert not a.snapshot_wanted
    rows, values = derive(a, [row({0: 3}, 0, 3, 0.3, base=({0: 2}, 0, 2), ident=7)], T0 + 2 * S)
    assert [r["count"] for r in rows] == [3]
    assert "histogram_without_base" not in values
    _recount(budget, [a.hist_bases, b.hist_bases])


def test_the_bound_holds_under_many_agents_and_accounting_stays_exact() -> None:
    """120 agents of 12 series each, snapshots then increments, restarts (a new epoch) and series
    that start again: the bytes never pass the bound, and equal the estimate of what is held."""
    rng = np.random.default_rng(14)
    budget = BaseBudget(150_000)
    agents = [HistogramBases(budget=budget) for _ in range(120)]
    held: list[dict[int, tuple[Buckets, int]]] = [{} for _ in agents]  # per agent: id -> last export
    epochs = [1] * len(agents)
    for step in range(5):
        for n, bases in enumerate(agents):
            if rng.random() < 0.05:
                epochs[n] += 1  # the agent restarted: its bases of two runs ago go
                held[n].clear()
            rows = []
            for ident in range(12):
                width = int(rng.integers(1, 40))
                last = held[n].get(ident)
                count = (0 if last is None else last[1]) + 100
                cum: Buckets = {i: count // width for i in range(width)}
                cum[0] += count - sum(cum.values())
                if (
                    last is not None
                    and rng.random() < 0.7
                    and all(cum.get(i, 0) >= c for i, c in last[0].items())
                ):
                    rows.append(row(cum, 0, count, 1.0, base=(last[0], 0, last[1]), ident=ident))
                else:
                    rows.append(row(cum, 0, count, 1.0, first=last is None, ident=ident))
                held[n][ident] = (cum, count)
            bases.resolve(decode(rows, T0 + step * S), epochs[n])
            assert budget.bytes <= budget.max_bytes
    assert budget.evictions > 0
    assert budget.bytes > budget.max_bytes // 2  # the room is used, not emptied by evictions
    _recount(budget, agents)


def test_a_series_that_starts_again_or_an_old_run_gives_its_bytes_back() -> None:
    budget = BaseBudget()
    bases = HistogramBases(budget=budget, epochs=1)
    bases.resolve(decode(_snapshots(range(5), 10, 500), T0), 1)
    assert budget.series == 5
    bases.resolve(decode([row({0: 3}, 0, 3, 0.1, first=True, ident=0)], T0 + S), 1)
    assert budget.series == 5
    _recount(budget, [bases])
    bases.resolve(decode(_snapshots(range(2), 10, 500), T0 + 2 * S), 2)  # a new run: the old one goes
    assert budget.series == 2
    _recount(budget, [bases])


def test_the_gauges_show_the_bases_held() -> None:
    budget = BaseBudget(1 << 20)
    metrics = CollectorMetrics()
    metrics.watch_histogram_bases(budget)
    HistogramBases(budget=budget).resolve(decode(_snapshots(range(3), 10, 500), T0), 1)
    got = {
        s.name: s.value
        for family in text_string_to_metric_families(metrics.exposition()[0].decode())
        for s in family.samples
        if s.name.startswith("ki_collector_increment_base")
    }
    assert got == {
        "ki_collector_increment_base_bytes": budget.bytes,
        "ki_collector_increment_base_limit_bytes": 1 << 20,
        "ki_collector_increment_base_series": 3,
        "ki_collector_increment_base_evictions_total": 0,
    }


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bound_that_is_no_size_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["collector", "--histogram-base-mb", value])
    assert "argument --histogram-base-mb: expected a number of MiB" in capsys.readouterr().err
    with pytest.raises(ValueError, match="negative"):
        BaseBudget(-1)


def test_increments_still_rebuild_kind_by_kind_under_a_shared_budget() -> None:
    """Two agents under one budget with the same series keys keep their bases apart."""
    budget = BaseBudget()
    a, b = HistogramBases(budget=budget), HistogramBases(budget=budget)
    a.resolve(decode([row({0: 1}, 0, 1, 0.1, first=True)], T0), 1)
    b.resolve(decode([row({0: 5}, 0, 5, 0.5, first=True)], T0), 1)
    out, missing = a.resolve(decode([row({0: 2}, 0, 2, 0.2, base=({0: 1}, 0, 1))], T0 + S), 1)
    assert missing == 0
    assert out is not None
    assert [(r.kind, r.count) for r in out.rows()] == [(HistKind.KERNEL, 2)]
    _, missing = b.resolve(decode([row({0: 2}, 0, 2, 0.2, base=({0: 1}, 0, 1))], T0 + S), 1)
    assert missing == 1  # b never shipped count 1
