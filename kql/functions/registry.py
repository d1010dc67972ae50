"""The one function registry: a decorator above each implementation records its signature.

The type checker reads argument and return types at parse time, the engine calls ``impl``
at run time; nothing else keeps a list of functions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernel_insight.kql.ast import RESULT_UNITS, ValueType

if TYPE_CHECKING:
    from kernel_insight.kql.values import Arg, CallContext, Value

__all__ = [
    "FUNCTIONS",
    "HISTOGRAM_READS",
    "HISTOGRAM_SAMPLES",
    "FunctionSpec",
    "GridPushdown",
    "HistImpl",
    "Impl",
    "function",
    "histogram_behaviour",
    "names_with",
]

#: An implementation receives the call context and the evaluated arguments.
Impl = Callable[["CallContext", list["Arg"]], "Value"]
#: A function's behaviour when native-histogram samples are among its arguments: it receives the
#: call context, the float implementation (for the float samples) and the evaluated arguments.
HistImpl = Callable[["CallContext", Impl, list["Arg"]], "Value"]


@dataclass(frozen=True, slots=True)
class GridPushdown:
    """``func(selector[range])`` on a step grid may be computed by a store declaring
    ``Capability.RANGE_ON_GRID``: the function is one reduction of each window's float samples,
    which a store may compute where the samples are. How a store computes it is the store's own
    table, keyed by the function's name (the ClickHouse one: collector/clickhouse/query.py's
    ``RANGE_GRID_AGGREGATES``); the store answers None for a function it has no entry for.

    Only functions whose pushed result equals the engine's own on randomized data carry one
    (``tests/kql/test_pushdown.py`` runs every such function both ways); ``keeps_name`` when
    the result keeps the metric name.
    """

    keeps_name: bool = False


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    """A function's signature.

    ``variadic`` follows Prometheus: 0 means exactly ``len(arg_types)`` arguments; n > 0 means
    the last argument is optional and may repeat up to n times; -1 means it may repeat without
    limit. ``time_dependent`` functions give different answers at different evaluation times
    even when their arguments do not change (they are never treated as step-invariant).
    """

    name: str
    arg_types: tuple[ValueType, ...]
    return_type: ValueType
    impl: Impl = field(compare=False, repr=False)
    variadic: int = 0
    experimental: bool = False
    time_dependent: bool = False
    unevaluated: tuple[int, ...] = ()  # arguments the implementation gets as AST nodes
    extension: bool = False  # a kql addition, not a PromQL function
    pushdown: GridPushdown | None = None  # a store may compute it on a step grid
    #: What it reads of the native histograms below it: "stats" (count and sum only; the selectors
    #: under it read counter-reset hints as Prometheus' HistogramStatsIterator gives them unless
    #: something between needs "buckets"), "buckets" (the whole histogram), or "" (no matter).
    histogram_reads: str = ""
    #: What it does with histogram samples it has no histogram behaviour of its own for (one of
    #: HISTOGRAM_SAMPLES): "" ignores them (floats only), "mixed_range_info" ignores them with
    #: Prometheus' info when a range held both kinds, "pass_through" carries them unchanged
    #: (labels or order only), "presence" counts a histogram as a sample present.
    histogram_samples: str = ""
    anchored: bool = False  # takes an ``anchored`` range (the checker reads it)
    smoothed: bool = False  # takes a ``smoothed`` range
    start_timestamps: bool = False  # reads its matrix selector's start timestamps (rate, increase, ...)
    sample_times: bool = False  # reads the sample times of its selector (timestamp())
    in_durations: bool = False  # also allowed in duration expressions (ranges, steps, offsets)
    #: The unit of its result, one of RESULT_UNITS (the web UI labels axes with it).
    result_unit: str = ""
    #: Its histogram behaviour (Prometheus branches to it inside the same function, as
    #: extrapolatedRate calls histogramRate), registered by :func:`histogram_behaviour`; None
    #: when ``histogram_samples`` says all there is to say.
    histogram_impl: HistImpl | None = field(default=None, compare=False, repr=False)
    doc: str = ""

    @property
    def min_args(self) -> int:
        return len(self.arg_types) if self.variadic == 0 else len(self.arg_types) - 1

    @property
    def max_args(self) -> int | None:
        if self.variadic == 0:
            return len(self.arg_types)
        if self.variadic < 0:
            return None
        return len(self.arg_types) - 1 + self.variadic

    def evaluate(self, ctx: CallContext, args: list[Arg]) -> Value:
        """Run the function on evaluated ``args``: with histogram samples among them, its
        ``histogram_impl`` (given the float implementation too) or what ``histogram_samples`` says."""
        # local: the checker imports the registry, which stays free of the evaluator's modules
        from kernel_insight.kql import histsamples as hs
        from kernel_insight.kql.values import RangeInput, StepVector

        if not hs.holds_histograms(args):
            return self.impl(ctx, args)
        if self.histogram_impl is not None:
            return self.histogram_impl(ctx, self.impl, args)
        if self.histogram_samples == "pass_through":
            return self.impl(ctx, args)
        if self.histogram_samples == "presence":
            return self.impl(ctx, [hs.presence_proxy(a) if isinstance(a, StepVector) else a for a in args])
        out = self.impl(ctx, [hs.without_histograms(a) for a in args])
        if self.histogram_samples == "mixed_range_info":
            for a in args:
                if isinstance(a, RangeInput):
                    hs.info_mixed_range(ctx, a)
        return out

    def arg_type(self, index: int) -> ValueType:
        """The expected type of argument ``index`` (repeated arguments share the last type)."""
        return self.arg_types[min(index, len(self.arg_types) - 1)]


#: Every function kql knows, by name.
FUNCTIONS: dict[str, FunctionSpec] = {}
#: The values of ``FunctionSpec.histogram_samples`` and ``histogram_reads``.
HISTOGRAM_SAMPLES = ("", "mixed_range_info", "pass_through", "presence")
HISTOGRAM_READS = ("", "stats", "buckets")


def histogram_behaviour(name: str) -> Callable[[HistImpl], HistImpl]:
    """Register the decorated code as what the function ``name`` does with histogram samples
    (its ``FunctionSpec.histogram_impl``); the function must be registered already."""

    def register(fn: HistImpl) -> HistImpl:
        spec = FUNCTIONS[name]
        if spec.histogram_impl is not None:
            raise ValueError(f"function {name!r}: histogram behaviour registered twice")
        FUNCTIONS[name] = dataclasses.replace(spec, histogram_impl=fn)
        return fn

    return register


def names_with(flag: str) -> tuple[str, ...]:
    """The functions whose spec has ``flag`` set, sorted (the checker's messages list them)."""
    return tuple(sorted(name for name, spec in FUNCTIONS.items() if getattr(spec, flag)))


def function(
    name: str,
    args: tuple[ValueType, ...],
    returns: ValueType,
    *,
    variadic: int = 0,
    experimental: bool = False,
    time_dependent: bool = False,
    unevaluated: tuple[int, ...] = (),
    extension: bool = False,
    pushdown: GridPushdown | None = None,
    histogram_reads: str = "",
    histogram_samples: str = "",
    anchored: bool = False,
    smoothed: bool = False,
    start_timestamps: bool = False,
    sample_times: bool = False,
    in_durations: bool = False,
    result_unit: str = "",
) -> Callable[[Impl], Impl]:
    """Register the decorated implementation under ``name``; the docstring becomes its doc."""

    def register(impl: Impl) -> Impl:
        if name in FUNCTIONS:
            raise ValueError(f"function {name!r} registered twice")
        if histogram_samples not in HISTOGRAM_SAMPLES or histogram_reads not in HISTOGRAM_READS:
            raise ValueError(f"function {name!r}: unknown histogram behaviour")
        if result_unit not in RESULT_UNITS:
            raise ValueError(f"function {name!r}: unknown result unit {result_unit!r}")
        FUNCTIONS[name] = FunctionSpec(
            name=name,
            arg_types=args,
            return_type=returns,
            impl=impl,
            variadic=variadic,
            experimental=experimental,
            time_dependent=time_dependent,
            unevaluated=unevaluated,
            extension=extension,
            pushdown=pushdown,
            histogram_reads=histogram_reads,
            histogram_samples=histogram_samples,
            anchored=anchored,
            smoothed=smoothed,
            start_timestamps=start_timestamps,
            sample_times=sample_times,
            in_durations=in_durations,
            result_unit=result_unit,
            doc=(impl.__doc__ or "").strip().split("\n")[0],
        )
        return impl

    return register
