"""Time and type-conversion functions: time, timestamp, calendar parts, vector, scalar, step/range/start/end."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.ast import VectorSelector
from kernel_insight.kql.functions._common import F64, S, V, map_values, unwrap
from kernel_insight.kql.functions.registry import function
from kernel_insight.kql.values import Arg, CallContext, StepVector, as_scalar, as_vector

__all__: list[str] = []

I64 = npt.NDArray[np.int64]


@function("time", (), S, time_dependent=True, result_unit="unitless")
def _time(ctx: CallContext, args: list[Arg]) -> F64:
    """Evaluation time in seconds since the epoch."""
    result: F64 = ctx.times / 1000.0
    return result


@function("vector", (S,), V)
def _vector(ctx: CallContext, args: list[Arg]) -> StepVector:
    """The scalar as a one-element vector with no labels."""
    values = np.asarray(as_scalar(args[0]), dtype=np.float64).reshape(1, -1)
    return StepVector([()], values, np.ones(values.shape, dtype=bool), np.zeros(1, dtype=bool))


@function("scalar", (V,), S)
def _scalar(ctx: CallContext, args: list[Arg]) -> F64:
    """The value of a one-element vector; NaN when the vector has zero or several elements."""
    vec = as_vector(args[0])
    if len(vec) == 0:
        return np.full(ctx.steps, np.nan)
    count = vec.present.sum(axis=0)
    value = np.where(vec.present, vec.values, 0.0).sum(axis=0)
    result: F64 = np.where(count == 1, value, np.nan)
    return result


@function(
    "timestamp",
    (V,),
    V,
    time_dependent=True,
    histogram_samples="presence",
    sample_times=True,
    result_unit="unitless",
)
def _timestamp(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Timestamp (seconds) of each sample: the sample's own time for a plain selector."""
    vec = as_vector(args[0])
    if vec.sample_ts is not None and isinstance(unwrap(ctx.node.args[0]), VectorSelector):
        stamps = vec.sample_ts / 1000.0
    else:
        stamps = np.broadcast_to(ctx.times / 1000.0, vec.values.shape)
    return map_values(vec, lambda v: np.array(stamps, dtype=np.float64))


@function("start_timestamp", (V,), V, experimental=True, histogram_samples="presence", sample_times=True)
def _start_timestamp(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Start timestamp (seconds, 0 when unset) of each sample of a plain selector; nothing for
    any other expression, which has none (Prometheus 3.14, experimental)."""
    vec = as_vector(args[0])
    node = unwrap(ctx.node.args[0])
    if vec.sample_ts is None or not isinstance(node, VectorSelector) or node.smoothed:
        return StepVector.empty(ctx.steps)
    starts = ctx.start_timestamps(node, vec)
    return map_values(vec, lambda v: starts / 1000.0)


def _calendar(name: str, part: Callable[[I64], npt.ArrayLike], doc: str) -> None:
    def impl(ctx: CallContext, args: list[Arg]) -> StepVector:
        if args:
            vec = as_vector(args[0])
        else:
            now = (ctx.times / 1000.0).reshape(1, -1)
            vec = StepVector([()], now, np.ones(now.shape, dtype=bool), np.zeros(1, dtype=bool))

        def compute(values: F64) -> F64:
            finite = np.isfinite(values)
            secs = np.trunc(np.where(finite, values, 0)).astype(np.int64)
            out = np.asarray(part(secs), dtype=np.float64)
            return np.where(finite, out, np.nan)

        return map_values(vec, compute)

    impl.__doc__ = doc
    function(name, (V,), V, variadic=1, time_dependent=True)(impl)


def _days(secs: I64) -> I64:
    return np.floor_divide(secs, 86400)


def _dt(secs: I64, unit: str) -> npt.NDArray[np.datetime64]:
    return secs.astype("datetime64[s]").astype(f"datetime64[{unit}]")


for _name, _part, _doc in (
    ("year", lambda s: _dt(s, "Y").astype(np.int64) + 1970, "Year (UTC) of each timestamp, default now."),
    ("month", lambda s: _dt(s, "M").astype(np.int64) % 12 + 1, "Month 1-12 (UTC)."),
    (
        "day_of_month",
        lambda s: (_dt(s, "D") - _dt(s, "M").astype("datetime64[D]")).astype(np.int64) + 1,
        "Day of month 1-31 (UTC).",
    ),
    (
        "day_of_year",
        lambda s: (_dt(s, "D") - _dt(s, "Y").astype("datetime64[D]")).astype(np.int64) + 1,
        "Day of year 1-366 (UTC).",
    ),
    ("day_of_week", lambda s: (_days(s) + 4) % 7, "Day of week 0-6, Sunday is 0 (UTC)."),
    ("hour", lambda s: np.floor_divide(s, 3600) % 24, "Hour 0-23 (UTC)."),
    ("minute", lambda s: np.floor_divide(s, 60) % 60, "Minute 0-59 (UTC)."),
    (
        "days_in_month",
        lambda s: ((_dt(s, "M") + 1).astype("datetime64[D]") - _dt(s, "M").astype("datetime64[D]")).astype(
            np.int64
        ),
        "Number of days in the month (UTC).",
    ),
):
    _calendar(_name, _part, _doc)


@function("step", (), S, in_durations=True)
def _step(ctx: CallContext, args: list[Arg]) -> F64:
    """The query's step in seconds (0 for an instant query)."""
    return np.full(ctx.steps, ctx.query_step_ms / 1000.0)


@function("range", (), S, in_durations=True)
def _range(ctx: CallContext, args: list[Arg]) -> F64:
    """The query's time range (end - start) in seconds (0 for an instant query)."""
    return np.full(ctx.steps, (ctx.query_end_ms - ctx.query_start_ms) / 1000.0)


@function("start", (), S)
def _start(ctx: CallContext, args: list[Arg]) -> F64:
    """The query's start time in seconds since the epoch."""
    return np.full(ctx.steps, ctx.query_start_ms / 1000.0)


@function("end", (), S)
def _end(ctx: CallContext, args: list[Arg]) -> F64:
    """The query's end time in seconds since the epoch."""
    return np.full(ctx.steps, ctx.query_end_ms / 1000.0)
