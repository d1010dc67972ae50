"""kql extensions for GPU fleets: functions PromQL lacks. None of these names exists in PromQL,
so no valid PromQL query changes meaning.
"""

from __future__ import annotations

import numpy as np

from kernel_insight.kql.functions._common import F64, STR, M, V, range_result
from kernel_insight.kql.functions.registry import function
from kernel_insight.kql.values import Arg, CallContext, StepVector, as_range, as_string, as_vector
from kernel_insight.kql.vectors import group_rows

__all__: list[str] = []


@function("time_weighted_avg_over_time", (M,), V, extension=True)
def _time_weighted_avg_over_time(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Mean weighted by how long each sample was current, from the first sample in the range to its end.

    Irregularly sampled gauges (NVML readings on change, DCGM fields at varying intervals)
    are what avg_over_time gets wrong: it weighs a reading held for a second like one held
    for a minute.
    """
    r = as_range(args[0])
    if len(r.vs) == 0:
        return StepVector.empty(ctx.steps)
    # Hold time of every sample until the next one of the same series (0 for a series' last).
    nxt = np.append(r.ts[1:], 0)
    held = np.where(np.isin(np.arange(len(r.ts)), r.offsets[1:] - 1), 0, nxt - r.ts).astype(np.float64)
    weighted = np.zeros(len(r.vs) + 1)
    np.cumsum(r.vs * held, out=weighted[1:])
    last = np.maximum(r.hi - 1, 0)
    first = np.minimum(r.lo, len(r.vs) - 1)
    inner = weighted[last] - weighted[np.minimum(r.lo, last)]  # samples before the last one
    tail = r.vs[last] * (r.end[None, :] - r.ts[last])
    span = (r.end[None, :] - r.ts[first]).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(span > 0, (inner + tail) / np.where(span > 0, span, 1.0), r.vs[last])
    return range_result(r, mean, r.counts > 0)


@function("zscore", (V, STR), V, variadic=-1, extension=True)
def _zscore(ctx: CallContext, args: list[Arg]) -> StepVector:
    """How many standard deviations each series is from the mean of its peers at every step.

    Peers are the series sharing the values of the given labels (all series when none are
    given): ``abs(zscore(step_time, "job")) > 3`` finds the straggler GPUs of each training job.
    """
    vec = as_vector(args[0])
    names = frozenset(as_string(a) for a in args[1:])
    keys = [tuple(p for p in labels if p[0] in names) for labels in vec.labels]
    gid, n = group_rows(keys)
    if n == 0:
        return vec
    steps = ctx.steps
    present = vec.present.astype(np.float64)
    values = np.where(vec.present, vec.values, 0.0)
    count = np.zeros((n, steps))
    total = np.zeros((n, steps))
    np.add.at(count, gid, present)
    np.add.at(total, gid, values)
    mean = total / np.maximum(count, 1)
    deviation = np.where(vec.present, vec.values - mean[gid], 0.0)
    squares = np.zeros((n, steps))
    np.add.at(squares, gid, deviation**2)
    std: F64 = np.sqrt(squares / np.maximum(count, 1))
    with np.errstate(invalid="ignore", divide="ignore"):
        z = deviation / std[gid]
    return StepVector(vec.labels, z, vec.present, np.ones(len(vec), dtype=bool))
