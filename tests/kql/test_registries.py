"""A new aggregation or function is one definition: the grammar, parser, checker, engine and push-down read the registries."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernel_insight.collector.clickhouse.query import RANGE_GRID_AGGREGATES, GridAggregate
from kernel_insight.collector.clickhouse.store import EmbeddedStore
from kernel_insight.collector.rows import SampleBuilder
from kernel_insight.kql import (
    AGGREGATORS,
    FUNCTIONS,
    Engine,
    GridPushdown,
    KqlParseError,
    MemoryStorage,
    format_expr,
    parse,
)
from kernel_insight.kql.aggregators import aggregator
from kernel_insight.kql.ast import AggregateExpr, ValueType
from kernel_insight.kql.functions import function
from kernel_insight.kql.parser import _parser
from kernel_insight.kql.values import StepVector

V, M = ValueType.VECTOR, ValueType.MATRIX


def _memory() -> MemoryStorage:
    mem = MemoryStorage()
    for inst, gpu, v in (("n0", "0", 1.0), ("n0", "1", 2.0), ("n1", "0", 5.0)):
        mem.add({"__name__": "gpu_temp", "instance": inst, "gpu": gpu}, [0, 15_000], [v, v + 1])
    return mem


@pytest.fixture
def scaled_sum() -> Iterator[str]:
    """A made-up aggregation, registered only by its decorator: ``scaled_sum(k, v)`` is ``k * sum(v)``."""

    @aggregator("scaled_sum", ValueType.SCALAR)
    def _scaled_sum(ev: Any, node: AggregateExpr, vec: StepVector, param: Any) -> StepVector:
        """k times the sum of each group."""
        total = AGGREGATORS["sum"].impl(ev, dataclasses.replace(node, op="sum"), vec, None)
        return StepVector(total.labels, total.values * np.asarray(param), total.present, total.drop_name)

    _parser.cache_clear()  # the grammar's AGG_OP token is built from the registry once
    try:
        yield "scaled_sum"
    finally:
        del AGGREGATORS["scaled_sum"]
        _parser.cache_clear()


def test_a_registered_aggregation_is_parsed_checked_printed_and_evaluated(scaled_sum: str) -> None:
    expr = parse("SCALED_SUM by (instance) (3, gpu_temp)")  # keywords are case-insensitive
    assert isinstance(expr, AggregateExpr)
    assert expr.op == "scaled_sum"
    assert parse(format_expr(expr)) == expr
    assert parse("scaled_sum(3, gpu_temp) by (instance)") == expr
    with pytest.raises(KqlParseError, match='expected type scalar in aggregation parameter of "scaled_sum"'):
        parse('scaled_sum("x", gpu_temp)')
    with pytest.raises(KqlParseError, match="expected 2, got 1"):
        parse("scaled_sum(gpu_temp)")
    got = Engine(_memory()).instant_query("scaled_sum by (instance) (3, gpu_temp)", 15_000).value
    assert {dict(s.labels)["instance"]: s.value for s in got.samples} == {"n0": 3 * (2 + 3), "n1": 3 * 6}


def test_a_name_that_is_not_registered_is_no_aggregation(scaled_sum: str) -> None:
    with pytest.raises(KqlParseError, match='unknown function with name "scaled_summ"'):
        parse("scaled_summ(3, gpu_temp)")


@pytest.mark.parametrize("name", sorted(AGGREGATORS))
def test_every_registered_aggregation_runs(name: str) -> None:
    param = {ValueType.SCALAR: "1, ", ValueType.STRING: '"v", '}.get(AGGREGATORS[name].param, "")  # type: ignore[arg-type]
    got = Engine(_memory()).instant_query(f"{name.upper()} by (instance) ({param}gpu_temp)", 15_000).value
    assert len(got.samples) >= 2  # both instances answer


def test_registering_an_aggregation_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        aggregator("sum")(AGGREGATORS["sum"].impl)


@pytest.fixture
def newest_in_window() -> Iterator[str]:
    """A made-up range function with a push-down: one decorator, nothing else."""
    name = "newest_in_window"
    function(name, (M,), V, pushdown=GridPushdown(keeps_name=True))(FUNCTIONS["last_over_time"].impl)
    try:
        yield name
    finally:
        del FUNCTIONS[name]


def test_a_registered_function_is_pushed_down_by_its_spec_and_the_stores_table(
    newest_in_window: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = (int(time.time()) // 3600) * 3_600_000 - 2 * 3_600_000  # inside the store's retention
    b = SampleBuilder()
    mem = MemoryStorage()
    for gpu in range(3):
        labels = {"__name__": "gpu_temp", "gpu": str(gpu)}
        ts = [base + i * 15_000 for i in range(240)]
        vs = [float(gpu * 1000 + i) for i in range(240)]
        b.add_series(labels, ts, vs)
        mem.add(labels, ts, vs)
    with EmbeddedStore(tmp_path / "db", cache_bytes=0) as store:  # no cache: ClickHouse computes grids
        store.insert_samples(b.build())
        ch = store.storage()
        answered: list[tuple[str, bool]] = []
        real = ch.select_range_on_grid

        def spy(*args: Any) -> Any:
            out = real(*args)
            answered.append((args[-1].func, out is not None))  # SelectHints.func
            return out

        monkeypatch.setattr(ch, "select_range_on_grid", spy)
        start, end = base + 600_500, base + 3_000_500
        query = f"{newest_in_window}(gpu_temp[2m])"
        # kql's flag alone: the store has no entry for the function, so the engine computes it.
        unpushed = Engine(ch).range_query(query, start, end, 60_000).value
        monkeypatch.setitem(RANGE_GRID_AGGREGATES, newest_in_window, GridAggregate("timeSeriesLastToGrid"))
        got = Engine(ch).range_query(query, start, end, 60_000).value
    assert answered == [(newest_in_window, False), (newest_in_window, True)]
    assert [s.labels for s in unpushed.series] == [s.labels for s in got.series]
    want = Engine(mem).range_query("last_over_time(gpu_temp[2m])", start, end, 60_000).value
    assert [s.labels for s in got.series] == [s.labels for s in want.series]
    assert got.series[0].labels[0] == ("__name__", "gpu_temp")  # keeps_name from the spec
    for x, y in zip(got.series, want.series, strict=True):
        np.testing.assert_array_equal(x.timestamps, y.timestamps)
        np.testing.assert_array_equal(x.values, y.values)
