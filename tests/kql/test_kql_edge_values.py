"""Every function, operator and aggregation over edge values (zeros of both signs, NaN, the
infinities, the largest and smallest floats, empty and odd histograms) answers or fails as a
KqlError (a 4xx from the API), never with another exception (a 500)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

import numpy as np
import pytest

from kernel_insight.kql import Engine, EngineLimits, KqlError, MemoryStorage
from kernel_insight.kql.ast import ValueType
from kernel_insight.kql.functions.registry import FUNCTIONS
from kernel_insight.kql.histogram import FloatHistogram

VALUES = [0.0, -0.0, 1.0, -1.0, math.nan, math.inf, -math.inf, 1e308, 5e-324, 0.5]
SCALARS = ["0", "-1", "1", "NaN", "Inf", "0.5", "2", "1e308"]
VECTORS = ["x_bucket", "z_bucket", "y", "h", "sum by (le) (x_bucket)", "-y", "h * 0", "h / 0"]
MATRICES = ["y[1m]", "h[1m]", "x_bucket[1m]", "h[5s]"]
STRINGS = ['"a"', '"le"', '""']
STEP_MS = 15_000


@pytest.fixture(scope="module")
def engine() -> Engine:
    rng = random.Random(14)
    s = MemoryStorage()
    ts = np.arange(12, dtype=np.int64) * STEP_MS
    for k in range(6):
        labels = {"k": str(k)}
        # x: positive bounds, often an empty first bucket; z: every odd bound there is
        for name, les in (
            ("x_bucket", ("0.1", "1", "+Inf")),
            ("z_bucket", ("0", "0.1", "+Inf", "NaN", "-Inf")),
        ):
            for le in les:
                s.add({"__name__": name, "le": le, **labels}, ts, np.array([rng.choice(VALUES) for _ in ts]))
        s.add({"__name__": "y", **labels}, ts, np.array([rng.choice(VALUES) for _ in ts]))
        hs = []
        for _ in ts:
            count = rng.choice([0.0, 1.0, 3.0, 10.0])
            hs.append(
                FloatHistogram(
                    schema=rng.choice([-4, 0, 3, 8]),
                    count=count,
                    sum=count * 0.1,
                    zero_count=rng.choice([0.0, 1.0]),
                    positive_spans=((0, 2),),
                    positive_buckets=(rng.choice([0.0, 1.0, 5.0]), rng.choice([0.0, 2.0])),
                )
            )
        s.add_histograms({"__name__": "h", **labels}, ts, hs)
    return Engine(s, EngineLimits(timeout_s=20))


def _function_calls() -> Iterator[str]:
    rng = random.Random(3)
    kinds = {ValueType.SCALAR: SCALARS, ValueType.VECTOR: VECTORS, ValueType.MATRIX: MATRICES}
    for name, spec in sorted(FUNCTIONS.items()):
        n = spec.min_args if spec.max_args is None else spec.max_args
        choices = [kinds.get(spec.arg_type(i), STRINGS) for i in range(n)]
        combos = list(itertools.product(*choices))
        rng.shuffle(combos)
        for args in combos[:150]:
            yield f"{name}({', '.join(args)})"


def _operations() -> Iterator[str]:
    operands = VECTORS + SCALARS
    ops = ["+", "-", "*", "/", "%", "^", "atan2", "==", "!=", ">", "<=", "and", "or", "unless", "== bool"]
    for a, b, op in itertools.product(operands, operands, ops):
        yield f"({a}) {op} ({b})"
    for agg, a in itertools.product(
        ["sum", "avg", "min", "max", "count", "stddev", "stdvar", "group"], VECTORS
    ):
        yield f"{agg} by (k) ({a})"
        yield f"{agg} without (le) ({a})"
    for agg, p, a in itertools.product(
        ["topk", "bottomk", "quantile", "limitk", "limit_ratio"], SCALARS, VECTORS
    ):
        yield f"{agg}({p}, {a})"
    for a, label in itertools.product(VECTORS, ['"v"', '"k"', '"le"']):
        yield f"count_values({label}, {a})"


def _failures(engine: Engine, queries: Iterator[str]) -> list[str]:
    out = []
    for query in queries:
        for instant in (True, False):
            try:
                if instant:
                    engine.instant_query(query, 150_000)
                else:
                    engine.range_query(query, 0, 165_000, STEP_MS)
            except KqlError:
                pass
            except Exception as exc:  # what the test is for: anything else is a 500
                out.append(f"{query}: {type(exc).__name__}: {exc}")
    return out


def test_every_function_over_edge_values(engine: Engine) -> None:
    assert _failures(engine, _function_calls()) == []


def test_every_operator_and_aggregation_over_edge_values(engine: Engine) -> None:
    assert _failures(engine, _operations()) == []
