"""Ports of Go's math (Ldexp, Log, Log2, Log10, Exp2) and Prometheus' Kahan increment, bit for bit.

The C library's log2/exp2 round differently from Go's; Prometheus' interpolations run Go's.
"""

from __future__ import annotations

import math
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from kernel_insight.kql.histogram.constants import _F64, _INF


def _ldexp(frac: float, exp: int) -> float:
    """Go's ``math.Ldexp``: overflow gives +Inf (Python raises)."""
    try:
        return math.ldexp(frac, exp)
    except OverflowError:
        return _INF


# --- Kahan-Neumaier summation: Prometheus' ``util/kahansum.Inc`` (``kahanSumInc`` in
# promql/functions.go before 3.x moved it), the one definition of the step in this code base.
# The scalar form is the port; the array forms give the same bits element by element
# (tests/kql/test_kql_numerics.py), and kql/native/windowsmodule.c's ``kahan_step`` is the C
# port of :func:`kahan_inc_into`, checked against :func:`kahan_inc` on the same inputs.


def kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    """Neumaier-compensated ``total + inc`` (Prometheus ``util/kahansum.Inc``): (new total, new c).

    The compensation is reset to 0 where the sum turns infinite, as Prometheus does, so a later
    finite term does not add ``inf - inf`` into it.
    """
    t = total + inc
    if math.isinf(t):
        c = 0.0
    elif abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def two_sum_into(total: _F64, inc: _F64, t: _F64, bb: _F64) -> None:
    """Knuth's TwoSum on arrays: ``t = total + inc`` and ``bb`` its exact rounding error.

    :func:`kahan_inc` picks Fast2Sum's operand order by magnitude; TwoSum needs no branch and
    yields the same error wherever ``total + inc`` is finite, at six ufuncs and no allocation.
    ``inc`` is overwritten (scratch); ``t`` and ``bb`` are outputs of ``total``'s shape.
    """
    np.add(total, inc, out=t)
    np.subtract(t, total, out=bb)  # bb = t - total
    np.subtract(inc, bb, out=inc)  # inc - bb
    np.subtract(t, bb, out=bb)  # t - bb
    np.subtract(total, bb, out=bb)  # total - (t - bb)
    np.add(bb, inc, out=bb)  # the rounding error of total + inc


def kahan_inc_into(total: _F64, comp: _F64, inc: _F64, t: _F64, bb: _F64) -> None:
    """:func:`kahan_inc` of every element in place on same-shaped float arrays (views welcome).

    ``total`` and ``comp`` are updated; ``inc``, ``t`` and ``bb`` are scratch (``inc`` is
    overwritten): lock-step loops run it once per window and sample without allocating.
    """
    two_sum_into(total, inc, t, bb)
    np.add(comp, bb, out=comp)
    inf = np.isinf(t)
    if inf.any():
        comp[inf] = 0.0
    total[...] = t


def kahan_inc_array(inc: npt.ArrayLike, total: npt.ArrayLike, comp: npt.ArrayLike) -> tuple[_F64, _F64]:
    """:func:`kahan_inc` of every element on copies, broadcasting: the new (sum, compensation) arrays."""
    t, c, i = (np.array(x, dtype=np.float64) for x in np.broadcast_arrays(total, comp, inc))
    kahan_inc_into(t, c, i, np.empty_like(t), np.empty_like(t))
    return t, c


# --- Go's math.Log2 and math.Exp2 (amd64), so interpolations match Prometheus to the bit ---------
# The C library's log2/exp2 are rounded differently (exp2(0.5) is 1.4142135623730951 in C,
# 1.414213562373095 in Go, which is what Prometheus prints for the median of its test histogram).

_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LOG2_E = float("1.44269504088896340735992468100189214")  # Go's constant 1/Ln2, rounded once
_HALF_SQRT2 = float("7.07106781186547524401e-01")
_L1, _L2, _L3, _L4 = (
    6.666666666666735130e-01,
    3.999999999940941908e-01,
    2.857142874366239149e-01,
    2.222219843214978396e-01,
)
_L5, _L6, _L7 = 1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01
_P1, _P2, _P3 = 1.66666666666666657415e-01, -2.77777777770155933842e-03, 6.61375632143793436117e-05
_P4, _P5 = -1.65339022054652515390e-06, 4.13813679705723846039e-08
_FRAC_LOG2: dict[float, float] = {}


def _go_log(x: float) -> float:
    """Go's ``math.Log`` (FreeBSD's algorithm, as math/log.go and log_amd64.s compute it) for finite x > 0."""
    f1, ki = math.frexp(x)
    if f1 < _HALF_SQRT2:
        f1 *= 2
        ki -= 1
    return _go_log_reduced(f1 - 1, float(ki))


_Num = TypeVar("_Num", float, _F64)


def _go_log_reduced(f: _Num, k: _Num) -> _Num:
    """The end of Go's ``math.Log`` once ``x = (1 + f) * 2**k``: one definition for
    :func:`_go_log` (floats) and :func:`go_log2_array` (numpy's elementwise IEEE arithmetic in
    the same order gives the same bits)."""
    s = f / (2 + f)
    s2 = s * s
    s4 = s2 * s2
    t1 = s2 * (_L1 + s4 * (_L3 + s4 * (_L5 + s4 * _L7)))
    t2 = s4 * (_L2 + s4 * (_L4 + s4 * _L6))
    r = t1 + t2
    hfsq = 0.5 * f * f
    return k * _LN2_HI - ((hfsq - (s * (hfsq + r) + k * _LN2_LO)) - f)


def go_log2(x: float) -> float:
    """Go's ``math.Log2``: exact for powers of two, ``Log(frac)*(1/Ln2) + exp`` otherwise."""
    if x != x or x == _INF:
        return x
    if x < 0:
        return math.nan
    if x == 0:
        return -_INF
    frac, exp = math.frexp(x)
    if frac == 0.5:
        return float(exp - 1)
    t = _FRAC_LOG2.get(frac)
    if t is None:
        t = _go_log(frac) * _LOG2_E
        if len(_FRAC_LOG2) < 4096:  # bucket bounds repeat: their fracs are one table
            _FRAC_LOG2[frac] = t
    return t + float(exp)


def go_log2_array(x: _F64) -> _F64:
    """:func:`go_log2` of every element, the same bits (numpy's elementwise IEEE arithmetic in
    the same order); elements outside (0, inf) go through :func:`go_log2` one by one."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    ok = np.isfinite(x) & (x > 0)
    frac, exp = np.frexp(x[ok])
    expf = exp.astype(np.float64)
    # _go_log(frac) * _LOG2_E + exp; frac is in [0.5, 1)
    f1, ki = frac, exp * 0
    low = f1 < _HALF_SQRT2
    f1 = np.where(low, f1 * 2, f1)
    k = np.where(low, ki - 1, ki).astype(np.float64)
    log = _go_log_reduced(f1 - 1, k)
    out[ok] = np.where(frac == 0.5, expf - 1, log * _LOG2_E + expf)
    for i in np.flatnonzero(~ok).tolist():
        out.flat[i] = go_log2(float(x.flat[i]))
    return out


def go_log_array(x: _F64) -> _F64:
    """Go's ``math.Log`` of every element (PromQL's ``ln``), the same bits as Prometheus on amd64:
    ``x = (1 + f) * 2**k`` with ``1 + f`` in [sqrt(2)/2, sqrt(2)), then :func:`_go_log_reduced`;
    Go's special cases (NaN and +Inf as they are, 0 -> -Inf, below 0 -> NaN)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    ok = np.isfinite(x) & (x > 0)
    # log_amd64.s splits the bits as they are (a subnormal is read as 2**-1022 times its
    # mantissa with an implicit leading 1, so ln(5e-324) is -709.09 there, as Prometheus answers);
    # for normal numbers this is frexp.
    bits = x[ok].view(np.uint64)
    exp = ((bits >> np.uint64(52)) & np.uint64(0x7FF)).astype(np.int64) - 0x3FE
    frac = ((bits & np.uint64(0x000FFFFFFFFFFFFF)) | np.uint64(0x3FE0000000000000)).view(np.float64)
    low = frac < _HALF_SQRT2
    f1 = np.where(low, frac * 2, frac)
    k = np.where(low, exp - 1, exp).astype(np.float64)
    out[ok] = _go_log_reduced(f1 - 1, k)
    bad = x[~ok]
    with np.errstate(invalid="ignore"):
        out[~ok] = np.where(bad == 0, -_INF, np.where(bad < 0, math.nan, bad))
    return out


#: Go's constant ``1/Ln10`` rounded once (math.Log10 is ``Log(x) * (1/Ln10)``).
_INV_LN10 = 0.4342944819032518


def go_log10_array(x: _F64) -> _F64:
    """Go's ``math.Log10`` of every element (PromQL's ``log10``): ``Log(x) * (1/Ln10)``."""
    out: _F64 = go_log_array(x) * _INV_LN10
    return out


def go_exp2_array(x: _F64) -> _F64:
    """:func:`go_exp2` of every element, the same bits; elements whose result is not a normal
    float (or is 0 or inf) go through :func:`go_exp2` one by one."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    ok = np.isfinite(x) & (x > -1020.0) & (x < 1020.0)
    v = x[ok]
    k = np.where(v > 0, np.trunc(v + 0.5), np.where(v < 0, np.trunc(v - 0.5), 0.0))
    t = v - k
    hi = t * _LN2_HI
    lo = -t * _LN2_LO
    r = hi - lo
    tt = r * r
    c = r - tt * (_P1 + tt * (_P2 + tt * (_P3 + tt * (_P4 + tt * _P5))))
    y = 1 - ((lo - (r * c) / (2 - c)) - hi)
    out[ok] = np.ldexp(y, k.astype(np.int64))
    for i in np.flatnonzero(~ok).tolist():
        out.flat[i] = go_exp2(float(x.flat[i]))
    return out


def go_exp2(x: float) -> float:
    """Go's ``math.Exp2`` (the pure-Go ``exp2``/``expmulti`` that amd64 runs)."""
    if x != x or x == _INF:
        return x
    if x == -_INF or x < -1.0740e03:
        return 0.0
    if x > 1.0239999999999999e03:
        return _INF
    k = int(x + 0.5) if x > 0 else int(x - 0.5) if x < 0 else 0
    t = x - float(k)
    hi = t * _LN2_HI
    lo = -t * _LN2_LO
    r = hi - lo
    tt = r * r
    c = r - tt * (_P1 + tt * (_P2 + tt * (_P3 + tt * (_P4 + tt * _P5))))
    y = 1 - ((lo - (r * c) / (2 - c)) - hi)
    return _ldexp(y, k)


def go_div(a: float, b: float) -> float:
    """IEEE division (Go's): x/0 is ±Inf or NaN rather than an exception."""
    if b == 0:
        if a == 0 or a != a:
            return math.nan
        return math.copysign(_INF, a) * math.copysign(1.0, b)
    return a / b
