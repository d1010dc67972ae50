"""Go's text for numbers and durations, where kql, rules and their APIs must print what Prometheus does.

Prometheus writes floats and durations with Go's ``strconv`` and ``time``; clients and rule tests
compare those bytes. One definition of each form lives here (issue: they were written in four
places): ``%g``/``%v`` (:func:`go_float`), ``strconv.FormatFloat(v, 'f', prec, 64)``
(:func:`go_float_fixed`) and ``time.Duration.String()`` (:func:`go_duration`). Prometheus'
``model.Duration`` (``1h30m``) is kql's own duration literal: ``kql.lexical.format_duration``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["go_duration", "go_float", "go_float_fixed"]


def go_float(x: float) -> str:
    """``x`` as Go's ``fmt`` prints a float64 with ``%v``/``%g``: the shortest digits that read back
    as ``x``, in exponent form (``e+06``, ``e-05``) when the exponent is below -4 or at least 6."""
    if x != x:
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if x == 0:
        return "-0" if math.copysign(1.0, x) < 0 else "0"
    r = repr(x)
    neg = r.startswith("-")
    if neg:
        r = r[1:]
    mant, _, e = r.partition("e")
    exp10 = int(e) if e else 0
    ip, _, fp = mant.partition(".")
    digits = (ip + fp).lstrip("0")
    # Decimal exponent of the first significant digit.
    dp = len(ip.lstrip("0")) + exp10 if ip.strip("0") else exp10 - (len(fp) - len(fp.lstrip("0")))
    digits = digits.rstrip("0") or "0"
    exp = dp - 1
    if exp < -4 or exp >= 6:
        body = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        s = f"{body}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    elif exp < 0:
        s = "0." + "0" * (-exp - 1) + digits
    elif len(digits) <= dp:
        s = digits + "0" * (dp - len(digits))
    else:
        s = digits[:dp] + "." + digits[dp:]
    return ("-" if neg else "") + s


def go_float_fixed(x: float, prec: int = -1) -> str:
    """``x`` as Go's ``strconv.FormatFloat(x, 'f', prec, 64)`` writes it: never an exponent; with
    ``prec`` -1 the shortest digits that read back as ``x`` (``"1"``, ``"0.5"``,
    ``"0.0000000005939"``, ``"1"`` and 100 zeros for 1e100), else ``prec`` decimals correctly
    rounded (``"10.000"``, as Prometheus' printer writes an ``@`` time); ``"+Inf"``, ``"NaN"``."""
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if prec >= 0:
        return f"{x:.{prec}f}"
    text = repr(float(x))
    if "e" in text or "E" in text:
        text = np.format_float_positional(x, trim="-")
    elif text.endswith(".0"):
        text = text[:-2]
    return text


def go_duration(ns: int) -> str:
    """``time.Duration(ns).String()``: ``0s``, ``750ns``, ``1.5µs``, ``1.5ms``, ``1.5s``, ``1m0s``, ``1h0m0.5s``."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_fraction(ns, 1_000)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{_fraction(ns, 1_000_000)}ms"
    h, rem = divmod(ns, 3_600_000_000_000)
    m, rem = divmod(rem, 60_000_000_000)
    s = _fraction(rem, 1_000_000_000)
    if h:
        return f"{sign}{h}h{m}m{s}s"
    if m:
        return f"{sign}{m}m{s}s"
    return f"{sign}{s}s"


def _fraction(n: int, unit: int) -> str:
    """``n / unit`` in decimal, exactly, without trailing zeros (Go's ``fmtFrac``)."""
    whole, frac = divmod(n, unit)
    if not frac:
        return str(whole)
    width = len(str(unit)) - 1
    return f"{whole}." + f"{frac:0{width}d}".rstrip("0")
