"""Float sample values as a decimal mantissa and scale where that gives them back bit for bit.

A gauge read as ``72.123456`` or a duration of whole nanoseconds as seconds spreads over a
binary float's whole mantissa, which no float codec shrinks (docs/storage.md, "Codecs"); the
integer ``72123456`` with scale 6 costs a few bits a sample under Delta + ZSTD. The samples
table keeps ``mantissa`` (Int64), ``scale`` (Int8) and ``float_value`` (Float64, the values no
decimal gives back) and reads them as one ``value`` (an ALIAS column, ``VALUE_ALIAS``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from kernel_insight.collector import _valuecodec

# The SQL side of the codec (the ``value`` column's expression) is SQL text: collector/clickhouse/sql.py.
from kernel_insight.collector.clickhouse.sql import MAX_SCALE, VALUE_ALIAS

__all__ = ["FLOAT_FORM", "MAX_SCALE", "VALUE_ALIAS", "decode_values", "encode_values", "encode_values_numpy"]

#: ``exp`` of a value kept as a float in ``value_f`` (NaN and stale markers, infinities, -0.0,
#: subnormals, magnitudes past 2**53, and decimals of more than MAX_SCALE places).
FLOAT_FORM = -1

_POW10 = 10.0 ** np.arange(MAX_SCALE + 1)
_POW10_INT = 10 ** np.arange(MAX_SCALE + 1, dtype=np.int64)
#: A mantissa is at most 2**53 in magnitude: every such integer is exact as a float, so the
#: division that decodes it is one correctly rounded IEEE operation on exact operands.
_LIMIT = float(2**53)
#: A fraction's mantissa has at most 14 significant digits. Near 2**53 / 10**k every float is
#: some m / 10**k (for values 4..9, nearly every random float is at scale 15), so a decimal of
#: 15-16 digits says nothing: a full-precision float series would land on decimals at random,
#: switching columns sample by sample (Delta then pays a full step in both). Under 10**14 few
#: random floats pass (14 digits against the float's 15.95). Integers (scale 0) keep
#: the whole 2**53: large byte counters are integers, not accidents.
_FRACTION_LIMIT = 1e14


F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]


#: The scales tried: a value exact at scale k is exact at every larger scale its mantissa fits
#: in (the same rational, exact operands), so testing these six finds the smallest of them that
#: holds, in at most six passes, and neighbouring values of a series mostly land on one scale.
_SCALES = (0, 3, 6, 9, 12, 15)


def _scales(v: F64) -> tuple[I64, I64]:
    """Per value: the smallest scale of ``_SCALES`` with ``m / 10**k`` bit-equal to it, and m
    (FLOAT_FORM and 0 where none is)."""
    n = len(v)
    scale = np.full(n, FLOAT_FORM, dtype=np.int64)
    mant = np.zeros(n, dtype=np.int64)
    bits = v.view(np.int64)
    with np.errstate(invalid="ignore"):
        cand = np.flatnonzero(np.abs(v) <= _LIMIT)  # NaN and infinities are never candidates
    x = v[cand]
    for k in _SCALES:
        if len(cand) == 0:
            break
        scaled = x * _POW10[k]
        # A larger scale only grows it: drop the rest for good.
        fits = np.abs(scaled) <= _LIMIT if k == 0 else np.abs(scaled) < _FRACTION_LIMIT
        if not fits.all():
            cand, x, scaled = cand[fits], x[fits], scaled[fits]
        m = np.rint(scaled).astype(np.int64)
        ok = (m.astype(np.float64) / _POW10[k]).view(np.int64) == bits[cand]
        hit = cand[ok]
        scale[hit] = k
        mant[hit] = m[ok]
        miss = ~ok
        cand, x = cand[miss], x[miss]
    return scale, mant


def encode_values(values: F64, series_idx: npt.NDArray[Any] | None = None) -> tuple[F64, I64, I8]:
    """``(float_value, mantissa, scale)`` for ``values``, by the C loop (``_valuecodec.encode``,
    one pass): the same arrays as ``encode_values_numpy``, which documents the rules."""
    v = np.ascontiguousarray(values, dtype=np.float64)
    n = len(v)
    float_value = np.empty(n, dtype=np.float64)
    mantissa = np.empty(n, dtype=np.int64)
    scale = np.empty(n, dtype=np.int8)
    if series_idx is None or n == 0:
        groups, top = None, np.empty(0, dtype=np.int8)
    else:
        groups = np.ascontiguousarray(series_idx, dtype=np.int32)
        top = np.full(int(groups.max()) + 1, FLOAT_FORM, dtype=np.int8)
    _valuecodec.encode(v, groups, top, float_value, mantissa, scale)
    return float_value, mantissa, scale


def encode_values_numpy(values: F64, series_idx: npt.NDArray[Any] | None = None) -> tuple[F64, I64, I8]:
    """The reference encoder (numpy): ``decode_values`` of its result is ``values`` bit for bit.

    A value that is ``m / 10**k`` exactly (|m| <= 2**53 for an integer, < 10**14 for a
    fraction) is stored as ``mantissa = m``, ``scale = k``, ``float_value = 0``; any other as
    ``scale = FLOAT_FORM``, ``mantissa = 0`` and the float itself in ``float_value``. Scales are
    0, 3, 6, 9, 12 or 15 (the smallest that holds), raised within one series of the batch
    (``series_idx``) to the series' largest: a series' mantissas then keep one scale from sample
    to sample, so Delta sees small steps instead of a factor of ten whenever a value happens to
    end in a zero. Raising keeps the value (the same rational, still exact operands); every
    decimal is checked again at the end all the same, and one that would not decode exactly
    stays a float.
    """
    v = np.ascontiguousarray(values, dtype=np.float64)
    scale, mant = _scales(v)
    if series_idx is not None and len(v):
        groups = np.asarray(series_idx, dtype=np.int64)
        top = np.full(int(groups.max()) + 1, FLOAT_FORM, dtype=np.int64)
        for k in _SCALES:  # ascending, so each series ends with its largest scale
            at = scale == k
            if at.any():
                top[groups[at]] = k
        want = np.where(scale >= 0, top[groups], FLOAT_FORM)
        up = np.flatnonzero(want > scale)
        if len(up):
            step = want[up] - scale[up]
            fits = np.abs(mant[up]).astype(np.float64) * _POW10[step] < _FRACTION_LIMIT  # want > 0
            up, step = up[fits], step[fits]
            raised = mant[up] * _POW10_INT[step]
            exact = np.abs(raised) < int(_FRACTION_LIMIT)
            up, raised = up[exact], raised[exact]
            mant[up] = raised
            scale[up] = want[up]
    # The guard: whatever the reasoning above, a decimal that does not decode to its value's
    # bits is stored as the float.
    d = np.flatnonzero(scale >= 0)
    back = (mant[d].astype(np.float64) / _POW10[scale[d]]).view(np.int64)
    wrong = d[back != v.view(np.int64)[d]]
    if len(wrong):
        scale[wrong] = FLOAT_FORM
        mant[wrong] = 0
    value_f = np.where(scale < 0, v, 0.0)
    return value_f, mant, scale.astype(np.int8)


def decode_values(value_f: F64, mant: I64, exp: npt.NDArray[np.integer[Any]]) -> F64:
    """The floats ``encode_values`` was given: ``VALUE_ALIAS`` in numpy (for tests and offline reads)."""
    e = np.asarray(exp, dtype=np.int64)
    dec = e >= 0
    out = np.array(value_f, dtype=np.float64, copy=True)
    out[dec] = np.asarray(mant, dtype=np.int64)[dec].astype(np.float64) / _POW10[e[dec]]
    return out
