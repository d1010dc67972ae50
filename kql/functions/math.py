"""Elementwise math on instant vectors: abs, rounding, clamping, exponentials, trigonometry."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kernel_insight.kql.functions._common import F64, S, V, map_values
from kernel_insight.kql.functions.registry import function
from kernel_insight.kql.histogram import go_log2_array, go_log10_array, go_log_array
from kernel_insight.kql.values import Arg, CallContext, StepVector, as_scalar, as_vector

__all__: list[str] = []


def _elementwise(name: str, fn: Callable[[F64], F64], doc: str) -> None:
    def impl(ctx: CallContext, args: list[Arg]) -> StepVector:
        return map_values(as_vector(args[0]), fn)

    impl.__doc__ = doc
    function(name, (V,), V)(impl)


for _name, _fn, _doc in (
    ("abs", np.abs, "Absolute value of every sample."),
    ("ceil", np.ceil, "Round every sample up to an integer."),
    ("floor", np.floor, "Round every sample down to an integer."),
    ("exp", np.exp, "e raised to every sample."),
    ("sqrt", np.sqrt, "Square root of every sample."),
    # Go's math.Log, Log2 and Log10 (ports): the C library's differ in the last bit now and then.
    ("ln", go_log_array, "Natural logarithm of every sample."),
    ("log2", go_log2_array, "Binary logarithm of every sample."),
    ("log10", go_log10_array, "Decimal logarithm of every sample."),
    ("sgn", np.sign, "Sign of every sample: -1, 0 or 1."),
    ("deg", np.degrees, "Radians to degrees."),
    ("rad", np.radians, "Degrees to radians."),
    ("sin", np.sin, "Sine (radians)."),
    ("cos", np.cos, "Cosine (radians)."),
    ("tan", np.tan, "Tangent (radians)."),
    ("asin", np.arcsin, "Arcsine."),
    ("acos", np.arccos, "Arccosine."),
    ("atan", np.arctan, "Arctangent."),
    ("sinh", np.sinh, "Hyperbolic sine."),
    ("cosh", np.cosh, "Hyperbolic cosine."),
    ("tanh", np.tanh, "Hyperbolic tangent."),
    ("asinh", np.arcsinh, "Inverse hyperbolic sine."),
    ("acosh", np.arccosh, "Inverse hyperbolic cosine."),
    ("atanh", np.arctanh, "Inverse hyperbolic tangent."),
):
    _elementwise(_name, _fn, _doc)


@function("round", (V, S), V, variadic=1)
def _round(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Round to the nearest multiple of ``to_nearest`` (default 1); halves round up."""
    vec = as_vector(args[0])
    nearest = as_scalar(args[1]) if len(args) > 1 else np.ones(ctx.steps)
    inverse = 1.0 / nearest[None, :]
    return map_values(vec, lambda v: np.floor(v * inverse + 0.5) / inverse)


@function("clamp", (V, S, S), V)
def _clamp(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Clamp every sample to [min, max]; empty where max < min."""
    vec, lo, hi = as_vector(args[0]), as_scalar(args[1]), as_scalar(args[2])
    out = map_values(vec, lambda v: np.maximum(lo[None, :], np.minimum(hi[None, :], v)))
    out.present = out.present & ~(hi < lo)[None, :]
    return out.compact()


@function("clamp_min", (V, S), V)
def _clamp_min(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Raise every sample to at least ``min``."""
    vec, lo = as_vector(args[0]), as_scalar(args[1])
    return map_values(vec, lambda v: np.maximum(lo[None, :], v))


@function("clamp_max", (V, S), V)
def _clamp_max(ctx: CallContext, args: list[Arg]) -> StepVector:
    """Lower every sample to at most ``max``."""
    vec, hi = as_vector(args[0]), as_scalar(args[1])
    return map_values(vec, lambda v: np.minimum(hi[None, :], v))


@function("pi", (), S)
def _pi(ctx: CallContext, args: list[Arg]) -> F64:
    """The number pi."""
    return np.full(ctx.steps, np.pi)


@function("min_of", (S, S), S, in_durations=True)
def _min_of(ctx: CallContext, args: list[Arg]) -> F64:
    """The smaller of two scalars (NaN if either is NaN); also usable in durations."""
    result: F64 = np.minimum(as_scalar(args[0]), as_scalar(args[1]))
    return result


@function("max_of", (S, S), S, in_durations=True)
def _max_of(ctx: CallContext, args: list[Arg]) -> F64:
    """The larger of two scalars (NaN if either is NaN); also usable in durations."""
    result: F64 = np.maximum(as_scalar(args[0]), as_scalar(args[1]))
    return result
