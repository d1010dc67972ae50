"""Bucket bounds of exponential and custom-bucket schemas (model/histogram/generic.go getBound)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kernel_insight.kql.histogram.constants import (
    _F64,
    _I64,
    _INF,
    _MAX_FLOAT,
    CUSTOM_BUCKETS_SCHEMA,
    HistogramError,
)
from kernel_insight.kql.histogram.exponential_bounds import EXPONENTIAL_BOUNDS
from kernel_insight.kql.histogram.gomath import _ldexp


def get_bound_exponential(idx: int, schema: int) -> float:
    """The upper bound of bucket ``idx`` in an exponential ``schema`` (Go ``getBoundExponential``)."""
    if schema < 0:
        exp = idx << -schema
        if exp == 1024:
            return _MAX_FLOAT  # the last bucket before the ±Inf bucket
        return _ldexp(1.0, exp)
    frac = EXPONENTIAL_BOUNDS[schema][idx & ((1 << schema) - 1)]
    exp = (idx >> schema) + 1
    if frac == 0.5 and exp == 1025:
        return _MAX_FLOAT
    return _ldexp(frac, exp)


def get_bound(idx: int, schema: int, custom_values: Sequence[float] = ()) -> float:
    """The upper bound of bucket ``idx`` (custom values for NHCB: -Inf at -1, +Inf past the last)."""
    if schema == CUSTOM_BUCKETS_SCHEMA:
        n = len(custom_values)
        if idx > n or idx < -1:
            raise HistogramError(f"index {idx} out of bounds for custom bounds of length {n}")
        if idx == n:
            return _INF
        if idx == -1:
            return -_INF
        return custom_values[idx]
    return get_bound_exponential(idx, schema)


def bounds_exponential(idx: _I64, schema: int) -> _F64:
    """Vectorised :func:`get_bound_exponential` (same bits: one ``ldexp`` per bound)."""
    with np.errstate(over="ignore"):
        if schema < 0:
            exp = idx << -schema
            out = np.ldexp(1.0, exp.astype(np.int64))
            out[exp == 1024] = _MAX_FLOAT
            neg_schema: _F64 = out
            return neg_schema
        table = np.asarray(EXPONENTIAL_BOUNDS[schema])
        frac = table[idx & ((1 << schema) - 1)]
        exp = (idx >> schema) + 1
        out = np.ldexp(frac, exp.astype(np.int64))
        out[(frac == 0.5) & (exp == 1025)] = _MAX_FLOAT
        result: _F64 = out
        return result
